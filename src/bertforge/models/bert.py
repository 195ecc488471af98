"""The BERT encoder: embeddings, transformer layers, pooler, and ``BertModel``.

Pure ``nn.Module`` code: no losses, data, precision or parallelism. Parameter names are those of
Hugging Face BERT, so ``BertModel().state_dict()`` *is* a transformers ``BertModel`` checkpoint
(except that embedding rows are padded to ``config.padded_vocab_size``; ``save_pretrained`` trims them).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from bertforge.errors import DataError
from bertforge.models.attention import BertAttention, BertResidualOutput
from bertforge.models.config import BertConfig
from bertforge.models.hub import PreTrainedModel
from bertforge.ops.attention import Attend
from bertforge.ops.dropout import Dropout
from bertforge.ops.linear import Linear
from bertforge.ops.unpad import Layout, RowLayout, TokenLayout, batch_layout

OnlyAt = str | torch.Tensor | None
"""Where ``BertModel.forward`` computes final states: None (every token), ``"first"`` (each
sequence's first token) or a head's positions, a (B, S) bool mask or ascending flat positions."""


class BertPreTrainedModel(PreTrainedModel):
    """Base of all bertforge BERT classes: BERT's names for the generic loading code, and its
    weight initialisation."""

    config: BertConfig
    config_class = BertConfig
    checkpoint_prefix = "bert"
    base_model_prefix = "bert"
    body_prefixes = ("embeddings.", "encoder.", "pooler.")
    head_prefixes = ("bert.pooler.", "pooler.", "cls.predictions.", "cls.seq_relationship.",
                     "qa_outputs.", "classifier.")
    tied_keys = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
    vocab_row_suffixes = ("embeddings.word_embeddings.weight", "cls.predictions.bias")
    # A fill-mask or QA model never uses the pooler, and transformers omits it from such files.
    optional_prefixes = ("bert.pooler.", "pooler.")
    last_layer_at: str | None = None
    """Where the heads read the final states, so where the encoder's last layer runs
    (``BertModel.forward``'s ``only_at``; ``bertforge.train.flops.read_tokens``): None (every
    token), "first" or "predicted" (the masked positions given to ``forward``)."""

    # ------------------------------------------------------------------ initialisation
    def init_weights(self, skip_prefix: str | None = None) -> None:
        """BERT initialisation: weights ~ N(0, initializer_range), biases 0, LayerNorm 1/0.

        Embedding rows past ``vocab_size`` and the [PAD] row are zeroed. ``skip_prefix`` names a
        submodule already initialised by its own constructor (the encoder inside task models).
        """
        self.normal_init_(self.config.initializer_range, skip_prefix)
        with torch.no_grad():
            # A tied decoder re-draws the embedding matrix above, so the zero rows are set last.
            emb = self.word_embeddings()
            emb.weight[self.config.vocab_size :].zero_()
            if emb.padding_idx is not None:
                emb.weight[emb.padding_idx].zero_()

    def word_embeddings(self) -> nn.Embedding:
        """The (padded_vocab_size, H) input embedding table."""
        base = getattr(self, self.base_model_prefix) if self.base_model_prefix else self
        return base.embeddings.word_embeddings

    def rename_legacy(self, name: str) -> str:
        # TensorFlow checkpoints name LayerNorm's parameters gamma and beta.
        if name.endswith("LayerNorm.gamma"):
            return name[: -len("gamma")] + "weight"
        if name.endswith("LayerNorm.beta"):
            return name[: -len("beta")] + "bias"
        return name

    def normalize_legacy(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        # Older checkpoints store the MLM bias only as the decoder's bias.
        if "cls.predictions.decoder.bias" in tensors and "cls.predictions.bias" not in tensors:
            tensors["cls.predictions.bias"] = tensors["cls.predictions.decoder.bias"]
        return tensors

    def mismatch_hints(self, names: list[str]) -> list[str]:
        if any("final_layer_norm" in k for k in names):
            return ["The checkpoint and config.json disagree on pre_layernorm."]
        return []


class BertModelOutput:
    """Encoder outputs. The final states stay in the layout the pass ran in (``states``:
    (B, S, H) padded rows, or the (T, H) real tokens of an unpadded pass, ``layout``) and are
    padded into ``last_hidden_state`` only if a caller asks for it. A pass run with ``only_at``
    (``BertModel.forward``) has its final states at those positions only (``at``)."""

    def __init__(self, last_hidden_state: torch.Tensor | None = None,
                 pooler_output: torch.Tensor | None = None, *,
                 states: torch.Tensor | None = None, layout: Layout | None = None,
                 at: torch.Tensor | None = None, only_at: OnlyAt = None) -> None:
        given = sum(x is not None for x in (last_hidden_state, states, at))
        if given != 1 or (states is None) != (layout is None) or (at is None) != (only_at is None):
            raise ValueError("BertModelOutput needs last_hidden_state, states with their layout, "
                             "or the states at only_at")
        if last_hidden_state is not None:
            states, layout = last_hidden_state, RowLayout(None, tuple(last_hidden_state.shape[:2]))
        self.states, self.layout, self._padded = states, layout, last_hidden_state
        self.at, self.only_at = at, only_at
        self.pooler_output = pooler_output
        """(N, H) tanh(dense(hidden of each sequence's first token)), N = B unless rows are
        packed, or None for models built without a pooler."""

    @property
    def last_hidden_state(self) -> torch.Tensor:
        """(B, S, H) final hidden states (after the final LayerNorm for pre-LN models); zeros at
        padding when the pass ran unpadded."""
        if self.states is None:
            raise ValueError("this pass computed the final states only at only_at's positions; "
                             "run the model without only_at for every token's")
        if self._padded is None:
            self._padded = self.layout.exit(self.states)
        return self._padded

    def select(self, masked_positions: torch.Tensor | None) -> torch.Tensor:
        """Hidden states where a head predicts: (N, H) at the True entries of a (B, S) bool mask
        or at (N,) int64 flat positions ``row * S + column`` (ascending), in row-major order;
        every position, (B, S, H), when ``masked_positions`` is None. A pass run with
        ``only_at=masked_positions`` has exactly these.

        Running the MLM head only where labels exist skips the (B*S, H) x (H, V) matmul for the
        ~85% of tokens that are not predicted. A bool mask costs one device->host sync for N;
        flat positions (what the pretraining loader ships) cost none.
        """
        if self.at is not None:
            if masked_positions is not self.only_at:
                raise ValueError("this pass computed the final states only at only_at's "
                                 "positions: select those (the same tensor) or run without only_at")
            return self.at
        if masked_positions is None:
            return self.last_hidden_state
        check_positions(masked_positions, self.layout.shape)
        return self.states.flatten(0, -2).index_select(0, self.layout.rows_of(masked_positions))


def check_positions(positions: torch.Tensor, shape: tuple[int, int]) -> None:
    """ValueError unless ``positions`` is a (B, S) bool mask or (N,) integer flat positions."""
    if positions.dtype == torch.bool:
        if positions.shape != shape:
            raise ValueError(f"masked_positions must be a bool tensor of shape {shape} or "
                             f"int64 flat positions, got bool {tuple(positions.shape)}")
    elif positions.dim() != 1 or positions.is_floating_point():
        raise ValueError("masked_positions must be a (B, S) bool mask or (N,) int64 flat "
                         f"positions, got {positions.dtype} {tuple(positions.shape)}")


class BertEmbeddings(nn.Module):
    """word + position + token-type embeddings, then LayerNorm and dropout."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(
            config.padded_vocab_size, config.hidden_size, padding_idx=config.pad_token_id
        )
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)
        # Not saved (persistent=False) so the state dict matches transformers' current layout.
        self.register_buffer(
            "position_ids", torch.arange(config.max_position_embeddings).unsqueeze(0), persistent=False
        )

    def check_length(self, seq_len: int) -> None:
        """DataError when rows of ``seq_len`` tokens do not fit the position table."""
        max_len = self.position_embeddings.num_embeddings
        if seq_len > max_len:
            raise DataError(
                f"input has {seq_len} tokens per sequence but the model's max_position_embeddings is "
                f"{max_len}: truncate inputs to at most {max_len} tokens (e.g. lower --max-seq-length)"
            )

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids, token_type_ids, position_ids: (B, S) int64, or (T,) for unpadded tokens
        (then with their ``position_ids``) -> (..., H). Positions default to the columns."""
        if position_ids is None:
            seq_len = input_ids.shape[-1]
            self.check_length(seq_len)
            position_ids = self.position_ids[:, :seq_len]
        emb = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        if token_type_ids is None:
            emb = emb + self.token_type_embeddings.weight[0]  # all segment 0; skip the gather
        else:
            emb = emb + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(emb))


class BertIntermediate(nn.Module):
    """First half of the feed-forward block: dense H -> intermediate, then the activation."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = Linear(config.hidden_size, config.intermediate_size)
        self.act = config.hidden_act

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, S, H) -> (B, S, intermediate)."""
        return self.dense(hidden, self.act)


class BertOutput(BertResidualOutput):
    """Second half of the feed-forward block (``output.dense``/``output.LayerNorm``), residual included."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config.intermediate_size, config)


class BertLayer(nn.Module):
    """One transformer layer: attention block then feed-forward block."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, hidden: torch.Tensor, attend: Attend,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        """(B, S, H) with a keep mask, or (T, H) with a ``TokenLayout`` -> same shape, or the
        (K, H) states at ``rows`` only (``BertModel.forward``'s ``only_at``)."""
        hidden = self.attention(hidden, attend, rows)
        return self.output(self.intermediate(self.output.normalize_input(hidden)), hidden)


class BertEncoder(nn.Module):
    """The stack of layers; pre-LN models end with ``final_layer_norm`` (absent in post-LN models)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        if config.pre_layernorm:
            # Pre-LN residual streams are never normalised inside the layers, so the output needs one.
            self.final_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.gradient_checkpointing = False
        """Recompute each layer's activations in backward instead of storing them (training only)."""

    def forward(self, hidden: torch.Tensor, attend: Attend,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        """(B, S, H) or unpadded (T, H) -> same shape; with ``rows`` (ascending indices into the
        states flattened to (tokens, H)), the (K, H) final states there only: the last layer
        then runs its queries, output projection and feed-forward block at those rows alone."""
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        last = len(self.layer) - 1
        for i, layer in enumerate(self.layer):
            at = rows if i == last else None
            if recompute:
                hidden = checkpoint(layer, hidden, attend, at, use_reentrant=False)
            else:
                hidden = layer(hidden, attend, at)
        if hasattr(self, "final_layer_norm"):
            hidden = self.final_layer_norm(hidden)
        return hidden


class BertPooler(nn.Module):
    """tanh(dense(hidden state of the first token)), the sentence vector NSP and classifiers use."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        """(N, H) hidden states of each sequence's first token -> (N, H)."""
        return torch.tanh(self.dense(first))


class BertModel(BertPreTrainedModel):
    """The bare encoder: ``forward`` -> ``BertModelOutput(last_hidden_state, pooler_output)``.

    Args:
        config: model shape.
        add_pooling_layer: build the pooler (task models that never use it omit it, like transformers).

    ``unpad`` (off by default; set from outside, ``bertforge.train.parallelize``) runs the
    layers on the real tokens only (``bertforge.ops.unpad``): the same outputs at real tokens,
    no work on padding.
    """

    base_model_prefix = ""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.unpad = False
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        layout: TokenLayout | None = None,
        *,
        only_at: OnlyAt = None,
    ) -> BertModelOutput:
        """input_ids, attention_mask (1 = real token), token_type_ids: (B, S) -> BertModelOutput.

        ``position_ids`` (B, S) mark packed rows: several sequences per row, each starting at
        position 0 and attending only to itself. ``layout`` is the batch's ``TokenLayout`` when
        the loader computed it (saves the model from finding it, and the syncs that costs).

        ``only_at`` computes the final states only where a head reads them: ``"first"`` (each
        sequence's first token: what the pooler and the classifiers read) or the positions a
        head will ``select`` (the pooler's first tokens are computed too). The last layer then
        runs its queries, output projection and feed-forward block at those tokens alone (its
        keys and values still cover every token), which gives the same values there; the
        output then has ``select(only_at)`` and ``pooler_output``, no ``last_hidden_state``.
        """
        # Padded rows or the real tokens only: the same code, the layout moves the states.
        where = batch_layout(input_ids, attention_mask, position_ids, layout, unpad=self.unpad)
        self.embeddings.check_length(input_ids.shape[-1])
        hidden = self.embeddings(where.enter(input_ids), where.enter(token_type_ids),
                                 where.positions)                 # (B, S, H) or (T, H)
        if only_at is None:
            hidden = self.encoder(hidden, where.attend)
            pooled = self.pooler(where.first_tokens(hidden)) if self.pooler is not None else None
            return BertModelOutput(pooler_output=pooled, states=hidden, layout=where)
        rows, firsts, order = self._rows(where, only_at, hidden.device)
        hidden = self.encoder(hidden, where.attend, rows)            # (K, H)
        if order is not None:
            hidden = hidden.index_select(0, order)
        pooled = self.pooler(hidden[:firsts]) if self.pooler is not None else None
        at = hidden if isinstance(only_at, str) else hidden[firsts:]
        return BertModelOutput(pooler_output=pooled, at=at, only_at=only_at)

    def _rows(self, where: Layout, only_at: str | torch.Tensor,
              device: torch.device) -> tuple[torch.Tensor, int, torch.Tensor | None]:
        """The ascending rows of the states ``only_at`` needs; how many of them, first in the
        output, are the sequences' first tokens; the order that puts the output so (or None)."""
        first = where.first_rows(device)
        if isinstance(only_at, str):
            if only_at != "first":
                raise ValueError(f"only_at must be 'first', a bool mask or flat positions, "
                                 f"got {only_at!r}")
            return first, first.shape[0], None
        check_positions(only_at, where.shape)
        picked = where.rows_of(only_at)
        if self.pooler is None:
            return picked, 0, None
        rows, order = torch.cat([first, picked]).sort()
        return rows, first.shape[0], torch.argsort(order)
