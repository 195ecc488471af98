"""Tasks of the one runner: each supplies data, model, loss and metrics (see ``base.Task``)."""
