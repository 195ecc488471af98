"""Using fine-tuned models: batch prediction (and, as it grows, interactive use and serving)."""
