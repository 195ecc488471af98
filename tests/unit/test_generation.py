"""Greedy and beam search on hand-made toy models whose answers are known, and GenerationConfig:
validation, overrides and generation_config.json round trips (transformers interop is in
tests/parity/test_generation_parity.py)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from bertforge.errors import ConfigError
from bertforge.models.generation import GENERATION_CONFIG_NAME, GenerationConfig, generate

V = 12
BOS, PAD, EOS = 0, 1, 2
START = EOS  # BART starts the decoder with </s>


class ToyModel:
    """A deterministic encoder-decoder with the interface ``generate`` uses.

    The next-token logits are ``tables[k][last token]``, where table ``k`` is chosen per input
    by the input's first id (the "encoder output" carries it, so each beam must get its own
    input's copy). With ``echo`` every token already in the decoder sequence loses ``echo`` per
    occurrence: a history the model only knows through its cache, which therefore must follow
    the beams. Every call is recorded.
    """

    def __init__(self, tables: torch.Tensor, echo: float = 0.0) -> None:
        self.tables = tables if tables.dim() == 3 else tables[None]
        self.echo = echo
        self.config = SimpleNamespace(vocab_size=V, bos_token_id=BOS, pad_token_id=PAD,
                                      eos_token_id=EOS, decoder_start_token_id=START,
                                      forced_bos_token_id=None, forced_eos_token_id=None)
        self.encoded = 0
        self.steps: list[tuple[int, ...]] = []
        self.reorders: list[torch.Tensor] = []
        self.grad_seen = False

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        self.encoded += 1
        return input_ids[:, :1, None].float()  # (B, 1, 1): the table of each input

    def logits_for(self, table: int, history: torch.Tensor) -> torch.Tensor:
        """(V,) logits after the decoder tokens ``history`` (T,), computed without a cache."""
        counts = torch.bincount(history, minlength=V).float()
        return self.tables[table, history[-1]] - self.echo * counts

    def decode_step(self, new_tokens, encoder_hidden, encoder_mask, cache):
        self.steps.append(tuple(new_tokens.shape))
        self.grad_seen |= torch.is_grad_enabled()
        assert encoder_hidden.shape[0] == new_tokens.shape[0] == encoder_mask.shape[0]
        history = new_tokens if cache is None else torch.cat([cache, new_tokens], dim=1)
        table = encoder_hidden[:, 0, 0].long()
        logits = torch.stack([self.logits_for(int(k), h) for k, h in zip(table, history)])
        return logits[:, None, :], history

    def reorder_cache(self, cache, index):
        self.reorders.append(index.clone())
        return cache[index]


def table(*rows: tuple[int, dict[int, float]]) -> torch.Tensor:
    """(V, V) logits: row t holds the given log-probabilities after token t; the mass left over
    is spread evenly over the other tokens."""
    out = torch.full((V, V), math.log(1.0 / V))
    for token, probs in rows:
        rest = (1.0 - sum(probs.values())) / (V - len(probs))
        out[token] = math.log(rest)
        for nxt, p in probs.items():
            out[token, nxt] = math.log(p)
    return out


def chain(stop: int) -> torch.Tensor:
    """Start -> 3 -> 4 -> ... -> stop -> EOS; past ``stop`` EOS stays first and t+1 second."""
    rows = {}
    for t in range(V):
        nxt = 3 if t in (BOS, PAD, START, V - 1) else t + 1
        rows[t] = {EOS: 0.6, nxt: 0.3} if t >= stop else {nxt: 0.6}
    return table(*rows.items())


def batch(*firsts: int, width: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs whose first id picks the toy table; the second row is padded."""
    ids = torch.full((len(firsts), width), 5)
    ids[:, 0] = torch.tensor(firsts)
    mask = torch.ones_like(ids)
    mask[1:, width // 2:] = 0
    return ids, mask


def config(**settings) -> GenerationConfig:
    return GenerationConfig.from_model_config(ToyModel(chain(5)).config, **settings)


# --------------------------------------------------------------------------- greedy


def test_greedy_follows_the_chain_and_pads_rows_that_ended():
    model = ToyModel(torch.stack([chain(5), chain(7)]))
    ids, mask = batch(0, 1)
    out = generate(model, ids, mask, config(max_length=20))
    assert out.tolist() == [[2, 3, 4, 5, 2, 1, 1], [2, 3, 4, 5, 6, 7, 2]]
    assert out.dtype == torch.int64 and not out.requires_grad
    # The encoder ran once; one decoder step per new token, through the cache (one new token
    # per step), for the rows still running: the first row ended at step 4 and left the batch
    # (the cache kept row 1 only), and no step ran after the last row ended.
    assert model.encoded == 1
    assert model.steps == [(2, 1)] * 4 + [(1, 1)] * 2
    assert not model.grad_seen
    assert [index.tolist() for index in model.reorders] == [[1]]


def test_without_a_pad_id_rows_are_filled_with_eos():
    model = ToyModel(torch.stack([chain(5), chain(7)]))
    out = generate(model, *batch(0, 1), config(max_length=20, pad_token_id=None))
    assert out[0].tolist() == [2, 3, 4, 5, 2, 2, 2]


def test_length_limits_and_forced_tokens():
    model = ToyModel(chain(9))
    ids, mask = batch(0)
    assert generate(model, ids, mask, config(max_length=4)).tolist() == [[2, 3, 4, 5]]
    # max_new_tokens counts generated tokens only and wins over max_length.
    assert generate(model, ids, mask, config(max_length=9, max_new_tokens=3)).tolist() == \
        [[2, 3, 4, 5]]
    # Forced EOS takes the last position; forced BOS the first generated one.
    assert generate(model, ids, mask, config(max_length=4, forced_eos_token_id=EOS)).tolist() \
        == [[2, 3, 4, 2]]
    assert generate(model, ids, mask, config(max_length=20, forced_bos_token_id=BOS)).tolist() \
        == [[2, 0, 3, 4, 5, 6, 7, 8, 9, 2]]
    # Both at once with room for one token: forced EOS wins.
    assert generate(model, ids, mask, config(max_length=2, forced_bos_token_id=BOS,
                                              forced_eos_token_id=EOS)).tolist() == [[2, 2]]


@pytest.mark.parametrize("settings", [dict(min_length=7), dict(min_new_tokens=6),
                                      dict(min_length=3, min_new_tokens=6)])
def test_min_length_bans_eos_until_the_sequence_is_long_enough(settings):
    model = ToyModel(chain(5))
    ids, mask = batch(0)
    assert generate(model, ids, mask, config()).tolist() == [[2, 3, 4, 5, 2]]
    # The sequence (start token included) must reach 7 tokens before EOS may come.
    assert generate(model, ids, mask, config(**settings)).tolist() == [[2, 3, 4, 5, 6, 7, 8, 2]]


def repeating_model() -> ToyModel:
    """Prefers 3 4 3 4 ...; second choices lead to EOS."""
    return ToyModel(table((START, {3: 0.9}), (3, {4: 0.6, 6: 0.3}), (4, {3: 0.6, 5: 0.3}),
                          (5, {EOS: 0.9}), (6, {EOS: 0.9})))


@pytest.mark.parametrize("size,expected", [
    (0, [2, 3, 4, 3, 4, 3, 4, 3]),
    (2, [2, 3, 4, 3, 6, 2]),      # "3 4" was seen, so 4 may not follow 3 again
    (3, [2, 3, 4, 3, 4, 5, 2]),   # "3 4 3" was seen, so 3 may not follow "3 4" again
])
def test_no_repeat_ngram_bans_the_token_that_repeats_an_ngram(size, expected):
    out = generate(repeating_model(), *batch(0), config(max_length=8, no_repeat_ngram_size=size))
    assert out.tolist() == [expected]


def test_repetition_penalty_divides_positive_and_multiplies_negative_scores():
    # After 3 the model prefers 3 again (logit 3) over 4 (logit 2); after 4, EOS (4).
    logits = torch.full((V, V), -10.0)
    logits[START, 3] = 4.0
    logits[3, 3], logits[3, 4] = 3.0, 2.0
    logits[4, EOS] = 4.0
    ids, mask = batch(0)
    model = ToyModel(logits)
    assert generate(model, ids, mask, config(max_length=6)).tolist() == [[2, 3, 3, 3, 3, 3]]
    # 3 was seen: 3 / 2 = 1.5 < 2, so 4 follows. EOS was seen too (the start token): 4 / 2 = 2
    # still leads.
    assert generate(model, ids, mask, config(max_length=6, repetition_penalty=2.0)).tolist() \
        == [[2, 3, 4, 2]]
    # After 4 the model prefers 5 (-1) over 6 (-2); 5 was seen, and -1 * 3 = -3 < -2.
    logits = torch.full((V, V), -10.0)
    logits[START, 5], logits[5, 4], logits[6, EOS] = 4.0, 4.0, 4.0
    logits[4, 5], logits[4, 6] = -1.0, -2.0
    model = ToyModel(logits)
    assert generate(model, ids, mask, config(max_length=6)).tolist() == [[2, 5, 4, 5, 4, 5]]
    assert generate(model, ids, mask, config(max_length=6, repetition_penalty=3.0)).tolist() \
        == [[2, 5, 4, 6, 2]]


def test_greedy_scores_are_summed_constrained_log_probs_over_length():
    model = ToyModel(chain(5))
    ids, mask = batch(0)
    for penalty in (0.0, 1.0, 2.0):
        seqs, scores = generate(model, ids, mask, config(length_penalty=penalty),
                                return_scores=True)
        tokens = seqs[0].tolist()
        want = sum(torch.log_softmax(model.logits_for(0, seqs[0, :i]), -1)[tokens[i]].item()
                   for i in range(1, len(tokens)))
        assert scores.shape == (1,)
        assert scores[0].item() == pytest.approx(want / (len(tokens) - 1) ** penalty, rel=1e-5)


# --------------------------------------------------------------------------- beam search


def detour_model() -> ToyModel:
    """Greedy takes 3 (p .5) and then ends with p .3; the 4 branch (p .4) ends with p .99."""
    return ToyModel(table((START, {3: 0.5, 4: 0.4}), (3, {EOS: 0.3}), (4, {EOS: 0.99})))


def test_beam_search_finds_the_sequence_greedy_misses():
    model = detour_model()
    ids, mask = batch(0)
    assert generate(model, ids, mask, config()).tolist() == [[2, 3, 2]]
    seqs, scores = generate(model, ids, mask, config(num_beams=2, num_return_sequences=2),
                            return_scores=True)
    assert seqs.tolist() == [[2, 4, 2], [2, 3, 2]]
    assert scores.tolist() == pytest.approx([math.log(0.4 * 0.99) / 2, math.log(0.5 * 0.3) / 2])


def length_model() -> ToyModel:
    """Short: 3 EOS (p .6 * .9); long: 4 5 EOS (p .39 * .95 * .95)."""
    return ToyModel(table((START, {3: 0.6, 4: 0.39}), (3, {EOS: 0.9}), (4, {5: 0.95}),
                          (5, {EOS: 0.95})))


@pytest.mark.parametrize("penalty,best", [(0.0, [2, 3, 2, 1]), (1.0, [2, 3, 2, 1]),
                                          (2.0, [2, 4, 5, 2])])
def test_length_penalty_divides_by_generated_length_to_the_power(penalty, best):
    seqs, scores = generate(length_model(), *batch(0), config(
        num_beams=2, num_return_sequences=2, length_penalty=penalty, early_stopping=True),
        return_scores=True)
    short, long = math.log(0.6 * 0.9) / 2 ** penalty, math.log(0.39 * 0.95 * 0.95) / 3 ** penalty
    assert seqs[0].tolist() == best
    assert sorted(scores.tolist(), reverse=True) == pytest.approx(sorted([short, long],
                                                                        reverse=True))
    assert scores[0] >= scores[1]
    assert sorted(map(tuple, seqs.tolist())) == [(2, 3, 2, 1), (2, 4, 5, 2)]


def late_model() -> ToyModel:
    """Ending at once is likeliest (p .46), but 3 4 EOS scores better per token."""
    return ToyModel(table((START, {EOS: 0.46, 3: 0.44}), (3, {EOS: 0.45, 4: 0.5}),
                          (4, {EOS: 0.9})))


def test_early_stopping_true_stops_once_every_beam_slot_is_filled():
    ids, mask = batch(0)
    model = late_model()
    out = generate(model, ids, mask, config(num_beams=2, early_stopping=True))
    # Step 1 finishes "EOS", step 2 finishes "3 EOS": two hypotheses for two beams, done.
    assert out.tolist() == [[2, 2]]
    assert len(model.steps) == 2
    for rule in (False, "never"):
        model = late_model()
        out = generate(model, ids, mask, config(num_beams=2, early_stopping=rule))
        # The running "3 4" (log .22 / 2) could still beat "3 EOS" (log .198 / 2): go on.
        assert out.tolist() == [[2, 3, 4, 2]], rule
        assert len(model.steps) >= 3


def test_beam_scores_match_a_recomputation_without_cache_so_the_cache_follows_the_beams():
    gen = torch.Generator().manual_seed(0)
    tables = torch.randn(2, V, V, generator=gen) * 2.0
    ids, mask = batch(0, 1)
    settings = config(num_beams=3, num_return_sequences=3, max_length=9, length_penalty=0.7)

    def recomputed(model: ToyModel, seqs: torch.Tensor) -> list[float]:
        out = []
        for row, seq in enumerate(seqs):
            body = seq[1:]
            ended = (body == EOS).nonzero()
            n = int(ended[0, 0]) + 1 if len(ended) else len(body)
            logp = sum(torch.log_softmax(model.logits_for(row // 3, seq[:i]), -1)[seq[i]].item()
                       for i in range(1, n + 1))
            out.append(logp / n ** 0.7)
        return out

    model = ToyModel(tables, echo=1.5)
    seqs, scores = generate(model, ids, mask, settings, return_scores=True)
    assert scores.tolist() == pytest.approx(recomputed(model, seqs), rel=1e-5)
    # Every step reordered the cache rows, each within its own input's block of beams; the
    # input that was done first left the batch (its rows were not kept), the other went on.
    assert model.reorders and len(model.reorders) == len(model.steps) - 1
    for index, next_step in zip(model.reorders, model.steps[1:]):
        blocks = (index // 3).tolist()
        assert blocks == sorted(blocks) and all(blocks.count(b) == 3 for b in blocks)
        assert next_step == (len(index), 1)
    assert any(not torch.equal(i, torch.arange(len(i))) for i in model.reorders)
    assert model.steps[0] == (6, 1) and model.steps[-1] == (3, 1) and model.encoded == 1
    # The check has teeth: a model that keeps the right rows but ignores their new order
    # scores differently.
    careless = ToyModel(tables, echo=1.5)
    careless.reorder_cache = lambda cache, index: cache[index.sort().values]
    seqs, scores = generate(careless, ids, mask, settings, return_scores=True)
    assert scores.tolist() != pytest.approx(recomputed(careless, seqs), rel=1e-5)


@pytest.mark.parametrize("beams,returned", [(1, 1), (3, 1), (4, 2)])
def test_a_batch_equals_its_inputs_alone_with_each_inputs_hypotheses_in_a_block(beams, returned):
    gen = torch.Generator().manual_seed(1)
    tables = torch.randn(3, V, V, generator=gen) * 2.0
    model = ToyModel(tables, echo=0.5)
    ids, mask = batch(0, 1, 2)
    settings = config(num_beams=beams, num_return_sequences=returned, max_length=10,
                      no_repeat_ngram_size=2)
    together, scores = generate(model, ids, mask, settings, return_scores=True)
    assert together.shape[0] == 3 * returned
    for i in range(3):
        alone, alone_scores = generate(model, ids[i:i + 1], mask[i:i + 1], settings,
                                       return_scores=True)
        block = together[i * returned:(i + 1) * returned]
        width = alone.shape[1]
        assert torch.equal(block[:, :width], alone)
        assert (block[:, width:] == PAD).all()
        assert torch.allclose(scores[i * returned:(i + 1) * returned], alone_scores)
    # Best first within a block.
    for i in range(3):
        block_scores = scores[i * returned:(i + 1) * returned]
        assert torch.equal(block_scores, block_scores.sort(descending=True).values)


def test_overrides_apply_to_one_call_only():
    model = detour_model()
    base = config()
    assert generate(model, *batch(0), base, num_beams=2).tolist() == [[2, 4, 2]]
    assert base.num_beams == 1
    with pytest.raises(ConfigError, match="Did you mean 'num_beams'"):
        generate(model, *batch(0), base, num_beam=2)


def test_without_settings_the_models_own_are_used_or_a_length_is_asked_for():
    model = ToyModel(chain(5))
    ids, mask = batch(0)
    with pytest.raises(ConfigError, match=r"this model has no generation settings .*pass a "
                                          r"length limit, e\.g\. generate\(model, ids, mask, "
                                          r"max_length=60"):
        generate(model, ids, mask)
    assert generate(model, ids, mask, max_length=20).tolist() == [[2, 3, 4, 5, 2]]
    model.generation_config = config(max_length=3)
    assert generate(model, ids, mask).tolist() == [[2, 3, 4]]
    assert generate(model, ids, mask, max_length=4).tolist() == [[2, 3, 4, 5]]


@pytest.mark.parametrize("beams,returned", [(1, 1), (3, 1), (4, 2)])
def test_reading_the_host_every_few_steps_changes_nothing_but_the_row_counts(beams, returned,
                                                                            monkeypatch):
    """On a GPU the search reads the host every few steps (done inputs ride along until then):
    the same sequences and scores as reading every step, on a CPU here."""
    from bertforge.models.generation import search

    gen = torch.Generator().manual_seed(2)
    tables = torch.randn(3, V, V, generator=gen) * 2.0
    tables[:, :, EOS] += torch.tensor([2.0, 0.0, -1.0])[:, None]  # different finish times
    ids, mask = batch(0, 1, 2)
    settings = config(num_beams=beams, num_return_sequences=returned, max_length=14,
                      no_repeat_ngram_size=2, early_stopping=beams == 3)
    every_step = ToyModel(tables, echo=0.5)
    want, want_scores = generate(every_step, ids, mask, settings, return_scores=True)
    monkeypatch.setattr(search, "CHECK_EVERY", {"cpu": 3})
    every_third = ToyModel(tables, echo=0.5)
    got, got_scores = generate(every_third, ids, mask, settings, return_scores=True)
    assert got.tolist() == want.tolist()
    assert torch.allclose(got_scores, want_scores)
    rows = [shape[0] for shape in every_step.steps]
    assert rows[0] == 3 * beams and rows[-1] < rows[0]  # inputs left the batch
    assert [shape[0] for shape in every_third.steps] != rows
    assert len(every_third.steps) >= len(every_step.steps)


def test_the_last_step_is_skipped_when_forced_eos_decides_it():
    model = ToyModel(chain(9))
    ids, mask = batch(0)
    out = generate(model, ids, mask, config(max_length=5, forced_eos_token_id=EOS))
    assert out.tolist() == [[2, 3, 4, 5, 2]]
    assert len(model.steps) == 3  # tokens 3, 4, 5; the forced EOS needed no decoder step
    seqs, scores = generate(model, ids, mask, config(max_length=5, forced_eos_token_id=EOS,
                                                     num_beams=2), return_scores=True)
    assert seqs[0].tolist() == [2, 3, 4, 5, 2] and torch.isfinite(scores).all()


@pytest.mark.parametrize("vocab,beams", [(8000, 4), (7919, 4), (50265, 2), (8000, 1), (99, 3)])
def test_blockwise_top_k_and_argmax_equal_torchs(vocab, beams):
    """The CPU shortcut (maxima per block first) gives torch.topk's and argmax's values and
    indices, also with ties and -inf (banned tokens) at the edge of the k best."""
    from bertforge.models.generation.beam import argmax, top_k

    gen = torch.Generator().manual_seed(vocab)
    scores = torch.log_softmax(torch.randn(6 * beams, vocab, generator=gen) * 3, dim=-1)
    scores[0, ::2] = -math.inf  # half the vocabulary banned
    scores[1, 5:] = -math.inf  # fewer finite scores than asked for
    scores[2, 100 % vocab] = scores[2, 7] = scores[2].max() + 1.0  # a tie for the best
    rows = scores.view(6, beams * vocab)
    values, indices = top_k(rows, 2 * beams)
    want = torch.topk(rows, 2 * beams)
    assert torch.equal(values, want.values)
    finite = torch.isfinite(values)
    assert torch.equal(indices[finite], want.indices[finite])
    assert torch.equal(argmax(scores), scores.argmax(dim=-1))


# --------------------------------------------------------------------------- input errors


def test_bad_inputs_raise_value_errors_naming_them():
    model = ToyModel(chain(5))
    ids, mask = batch(0, 1)
    with pytest.raises(ValueError, match="input_ids must be a \\(batch, length\\) integer"):
        generate(model, ids[0], None, config())
    with pytest.raises(ValueError, match="input_ids must be"):
        generate(model, ids.float(), None, config())
    with pytest.raises(ValueError, match="at least one"):
        generate(model, ids[:, :0], None, config())
    with pytest.raises(ValueError, match="attention_mask must have input_ids' shape"):
        generate(model, ids, mask[:, :2], config())
    mask[1] = 0
    with pytest.raises(ValueError, match="attention_mask row 1 has no real token"):
        generate(model, ids, mask, config())


def test_settings_that_do_not_fit_the_model_raise_config_errors():
    model = ToyModel(chain(5))
    ids, mask = batch(0)
    with pytest.raises(ConfigError, match="eos_token_id=12 .* ids 0..11"):
        generate(model, ids, mask, config(eos_token_id=12))
    with pytest.raises(ConfigError, match="decoder_start_token_id and bos_token_id"):
        generate(model, ids, mask, GenerationConfig(eos_token_id=EOS))
    # bos_token_id stands in for a missing decoder start token.
    out = generate(model, ids, mask, GenerationConfig(bos_token_id=4, eos_token_id=EOS))
    assert out.tolist() == [[4, 5, 2]]


def test_a_model_returning_malformed_logits_is_reported():
    model = ToyModel(chain(5))
    model.decode_step = lambda new, enc, mask, cache: (torch.zeros(new.shape[0], V), cache)
    with pytest.raises(ValueError, match=r"decode_step returned logits of shape \(1, 12\)"):
        generate(model, *batch(0), config())


# --------------------------------------------------------------------------- GenerationConfig


def test_from_model_config_takes_the_special_ids_from_objects_and_dicts():
    ids = dict(bos_token_id=0, eos_token_id=2, pad_token_id=1, decoder_start_token_id=2,
               forced_bos_token_id=0, forced_eos_token_id=2)
    from_object = GenerationConfig.from_model_config(SimpleNamespace(**ids, vocab_size=99))
    from_dict = GenerationConfig.from_model_config({**ids, "d_model": 8}, num_beams=4)
    for name, value in ids.items():
        assert getattr(from_object, name) == value == getattr(from_dict, name)
    assert (from_object.num_beams, from_dict.num_beams) == (1, 4)
    assert GenerationConfig.from_model_config(SimpleNamespace()).eos_token_id is None


@pytest.mark.parametrize("settings,message", [
    (dict(num_beams=0), "num_beams=0 is invalid"),
    (dict(num_beams=True), "num_beams=True is invalid: expected an integer"),
    (dict(num_beams=2, num_return_sequences=3), "num_return_sequences=3 .* between 1 and "
                                                "num_beams=2"),
    (dict(min_length=21), "min_length=21 .* longer sequences than max_length=20"),
    (dict(max_new_tokens=4, min_new_tokens=5), "min_new_tokens=5 .* max_new_tokens=4"),
    (dict(max_length=None), "max_length and max_new_tokens are both null"),
    (dict(max_length=1), "max_length=1 .* counts the decoder start token"),
    (dict(max_new_tokens=0), "max_new_tokens=0 .* >= 1"),
    (dict(min_length=-1), "min_length=-1"),
    (dict(early_stopping="sometimes"), "early_stopping='sometimes' .* \"never\""),
    (dict(early_stopping=1), "early_stopping=1"),
    (dict(do_sample=True), "do_sample=True .* greedy or beam search only"),
    (dict(length_penalty="2"), "length_penalty='2' .* finite number"),
    (dict(length_penalty=math.inf), "length_penalty=inf"),
    (dict(repetition_penalty=0.0), "repetition_penalty=0.0 .* > 0"),
    (dict(no_repeat_ngram_size=-2), "no_repeat_ngram_size=-2"),
    (dict(eos_token_id=-1), "eos_token_id=-1 .* >= 0"),
    (dict(pad_token_id=1.0), "pad_token_id=1.0 .* integer or null"),
])
def test_invalid_settings_raise_config_errors_naming_the_setting(settings, message):
    with pytest.raises(ConfigError, match=message):
        GenerationConfig().replace(**settings)


def test_replace_validates_and_suggests_close_names():
    base = GenerationConfig(num_beams=4)
    assert base.replace(length_penalty=2).length_penalty == 2.0
    assert isinstance(base.replace(length_penalty=2).length_penalty, float)
    assert base.replace(early_stopping="never").early_stopping == "never"
    with pytest.raises(ConfigError, match="Did you mean 'length_penalty'"):
        base.replace(lenght_penalty=2.0)
    assert GenerationConfig(max_new_tokens=5).length_limits() == (0, 6)
    assert GenerationConfig(min_new_tokens=2, min_length=9).length_limits() == (3, 20)


def test_file_round_trip(tmp_path):
    original = GenerationConfig(max_length=None, max_new_tokens=30, min_length=4, num_beams=4,
                                length_penalty=2.0, early_stopping="never", num_return_sequences=2,
                                no_repeat_ngram_size=3, repetition_penalty=1.2, bos_token_id=0,
                                eos_token_id=2, pad_token_id=1, decoder_start_token_id=2,
                                forced_bos_token_id=0, forced_eos_token_id=2)
    path = original.save(tmp_path / "model")
    assert path == tmp_path / "model" / GENERATION_CONFIG_NAME
    data = json.loads(path.read_text())
    assert data["max_length"] is None and data["num_beams"] == 4 and "bertforge_version" in data
    assert GenerationConfig.load(tmp_path / "model") == original
    assert GenerationConfig.load(path) == original  # the file's own path works too
    assert GenerationConfig.from_dict(original.to_dict()) == original
    assert [p.name for p in (tmp_path / "model").iterdir()] == [GENERATION_CONFIG_NAME]


def test_hand_written_dicts_must_use_known_settings():
    with pytest.raises(ConfigError, match="my.json: unknown generation setting 'num_beam'. "
                                          "Did you mean 'num_beams'"):
        GenerationConfig.from_dict({"num_beam": 4}, source="my.json")
    with pytest.raises(ConfigError, match="expected a JSON object"):
        GenerationConfig.from_dict([1, 2])
    # A null where a number belongs is a mistake in a hand-written file.
    with pytest.raises(ConfigError, match="num_beams=None"):
        GenerationConfig.from_dict({"num_beams": None})


def test_dicts_written_by_transformers_are_read_leniently_but_never_wrongly():
    hf = {"transformers_version": "5.0.0", "num_beams": 4, "early_stopping": None,
          "output_scores": False, "cache_implementation": None, "temperature": 0.7,
          "suppress_tokens": None, "eos_token_id": [2], "max_length": 62}
    config = GenerationConfig.from_dict(hf)
    assert (config.num_beams, config.early_stopping, config.eos_token_id, config.max_length) == \
        (4, False, 2, 62)
    # No length limit in such a file means 20 new tokens.
    assert GenerationConfig.from_dict({"transformers_version": "5.0.0"}).max_length == 21
    with pytest.raises(ConfigError, match="suppress_tokens=\\[5\\] is not supported"):
        GenerationConfig.from_dict({**hf, "suppress_tokens": [5]})
    with pytest.raises(ConfigError, match="num_beam_groups=2 is not supported"):
        GenerationConfig.from_dict({**hf, "num_beam_groups": 2})
    with pytest.raises(ConfigError, match="one EOS id"):
        GenerationConfig.from_dict({**hf, "eos_token_id": [2, 3]})
    with pytest.raises(ConfigError, match="do_sample=True"):
        GenerationConfig.from_dict({**hf, "do_sample": True})


def test_loading_reports_missing_and_broken_files(tmp_path):
    with pytest.raises(ConfigError, match="generation_config.json: no such file"):
        GenerationConfig.load(tmp_path)
    (tmp_path / GENERATION_CONFIG_NAME).write_text('{\n  "num_beams": 4,\n}\n')
    with pytest.raises(ConfigError, match=r"generation_config.json:3:1: not valid JSON"):
        GenerationConfig.load(tmp_path)
    (tmp_path / GENERATION_CONFIG_NAME).write_text('{"num_beams": 0}')
    with pytest.raises(ConfigError, match=r"generation_config.json: generation setting "
                                          r"num_beams=0 is invalid"):
        GenerationConfig.load(tmp_path)


# ---------------------------------------------------------------------------------------------
# bertforge's BART key/value cache: preallocated buffers that grow, reordered rows, and
# cross-attention entries that follow the encoder states passed to decode_step.


def tiny_bart():
    from bertforge.models.bart import BartConfig, BartForConditionalGeneration

    config = BartConfig(vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=2,
                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=24,
                        decoder_ffn_dim=24, max_position_embeddings=64, dropout=0.0,
                        attention_dropout=0.0, activation_dropout=0.0, pad_token_id=PAD,
                        bos_token_id=BOS, eos_token_id=EOS, decoder_start_token_id=START)
    torch.manual_seed(3)
    model = BartForConditionalGeneration(config).eval()
    with torch.no_grad():  # a larger spread than BART's init, so the inputs matter visibly
        for name, tensor in model.named_parameters():
            if "norm" not in name:
                tensor.normal_(0.0, 0.3)
    return model


def test_kv_cache_grows_and_reorders_like_a_recomputation_without_cache():
    model = tiny_bart()
    gen = torch.Generator().manual_seed(4)
    src = torch.randint(3, 40, (4, 7), generator=gen)
    mask = torch.ones_like(src)
    mask[1, 5:] = 0
    tokens = torch.randint(3, 40, (4, 45), generator=gen)
    tokens[:, 0] = START
    with torch.no_grad():
        encoded = model.encode(src, mask)
        enc, enc_mask, seqs, cache = encoded, mask, tokens[:, :1], None
        for step in range(44):  # past the first buffers (32 steps): they grow once
            if step == 10:  # beam-search style: rows move within pairs, same encoder tensor
                order = torch.tensor([1, 1, 3, 2])
                enc_src, enc_src_mask = src[[0, 0, 2, 2]], mask[[0, 0, 2, 2]]
                enc = model.encode(enc_src, enc_src_mask)
                enc_mask = enc_src_mask
                cache = model.reorder_cache(cache, torch.tensor([0, 0, 2, 2]))
                seqs = seqs[[0, 0, 2, 2]]
                # a second reorder within pairs keeps using the same encoder tensor
                cache = model.reorder_cache(cache, order)
                seqs = seqs[order]
            if step == 20:  # fewer rows (an input dropped): new buffers of 3 rows
                keep = torch.tensor([3, 0, 1])
                cache = model.reorder_cache(cache, keep)
                seqs, enc, enc_mask = seqs[keep], enc[keep], enc_mask[keep]
            logits, cache = model.decode_step(seqs[:, -1:], enc, enc_mask, cache)
            assert cache.length == seqs.shape[1]
            rows = seqs.shape[0]
            seqs = torch.cat([seqs, tokens[:rows, step + 1:step + 2]], dim=1)
        sources = {0: 0, 1: 0, 2: 2, 3: 2}  # encoder row of each decoder row after step 10
        src_rows = torch.tensor([sources[int(i)] for i in (3, 0, 1)])
        full = model(src[src_rows], mask[src_rows], seqs[:, :-1]).logits[:, -1]
    assert (logits[:, -1] - full).abs().max() < 1e-4
    # The check has teeth: another history gives other logits.
    with torch.no_grad():
        other = model(src[src_rows], mask[src_rows], seqs[[1, 2, 0], :-1]).logits[:, -1]
    assert (logits[:, -1] - other).abs().max() > 1e-2


def test_cross_attention_entries_follow_the_encoder_states_passed():
    model = tiny_bart()
    gen = torch.Generator().manual_seed(5)
    src = torch.randint(3, 40, (2, 6), generator=gen)
    mask = torch.ones_like(src)
    dec = torch.tensor([[START, 5, 6], [START, 7, 8]])
    with torch.no_grad():
        encoded = model.encode(src, mask)
        _, cache = model.decode_step(dec[:, :2], encoded, mask, None)
        swap = torch.tensor([1, 0])
        cache = model.reorder_cache(cache, swap)
        # A new (reordered) encoder tensor: the entries are recomputed from it.
        swapped, _ = model.decode_step(dec[swap, 2:], encoded[swap], mask[swap], cache)
        want = model(src[swap], mask[swap], dec[swap]).logits[:, -1:]
        assert (swapped - want).abs().max() < 1e-4
        # Changed in place: recomputed too.
        _, cache = model.decode_step(dec[:, :2], encoded, mask, None)
        encoded.copy_(encoded[swap])
        cache = model.reorder_cache(cache, swap)
        again, _ = model.decode_step(dec[swap, 2:], encoded, mask[swap], cache)
        assert (again - want).abs().max() < 1e-4
        # Passing the old states with a reordered cache mixes inputs (the test can fail).
        stale = model.encode(src, mask)
        _, cache = model.decode_step(dec[:, :2], stale, mask, None)
        cache = model.reorder_cache(cache, swap)
        mixed, _ = model.decode_step(dec[swap, 2:], stale, mask, cache)
        assert (mixed - want).abs().max() > 1e-2
