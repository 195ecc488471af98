"""Training: the one runner shared by pretraining and fine-tuning, and what it needs around it.

``run`` builds, restores, loops and finishes any ``task.Task``; ``loop`` is the train step and the
loop around it; ``checkpoint`` writes and finds atomic, Hugging Face-format checkpoints with their
training state (every random number generator included, so a resumed run repeats the
uninterrupted one); ``guards`` picks and verifies what a run resumes from and keeps non-finite or
oversized models out; ``run_log`` is what a run tells its user; ``distributed`` the process group,
DDP and FSDP.
"""
