"""What a built model runs under, for training and serving alike: its numerics
(``runtime.precision``: autocast dtype, TF32 scopes, the fp16 loss scaler) and its device
(``runtime.device``: ``auto``, ``cpu``, ``cuda[:N]`` checked against the machine).

Below training, tasks, inference and the server, so that a pipeline or ``bertforge serve``
imports nothing of the trainer; imports only ``bertforge.core`` and ``errors`` (and torch).
"""
