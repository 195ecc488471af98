"""Training: the one train loop shared by pretraining and fine-tuning, and what it needs around it.

``checkpoint`` writes and finds atomic, Hugging Face-format checkpoints with their training state;
``rng`` captures and restores every random number generator so a resumed run repeats the
uninterrupted one.
"""
