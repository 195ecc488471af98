"""Training: the one runner shared by pretraining and fine-tuning, and what it needs around it.

``run`` builds, restores, loops and finishes any ``task.Task``; ``loop`` is the train step, the
loop around it and what the run tells its user (``RunLogger``); ``checkpoint`` writes and finds atomic, Hugging Face-format checkpoints with their
training state (every random number generator included, so a resumed run repeats the
uninterrupted one); ``guards`` picks and verifies what a run resumes from and keeps non-finite or
oversized models out; ``distributed`` the process group, DDP and FSDP.
"""
