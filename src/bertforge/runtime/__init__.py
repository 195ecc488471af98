"""What a built model runs under, for training and serving alike: its numerics
(``runtime.precision``: autocast dtype, TF32 scopes, the fp16 loss scaler), the precision
inference chooses and the quality guard it is held to (``runtime.guard``), the CPU's units and
cores (``runtime.cpu``) and its device (``runtime.device``: ``auto``, ``cpu``, ``cuda[:N]``
checked against the machine).

Below training, tasks, inference and the server, so that a pipeline or ``bertforge serve``
imports nothing of the trainer; imports only ``bertforge.core``, ``errors``, ``ops`` (the int8
and bf16 linear layers) and torch.
"""
