"""Batch makers, one per input shape: masked-LM pretraining (``mlm``), encoder-decoder pairs and
BART denoising (``seq2seq``), single texts and text pairs for classification, QA and tagging
(``sequences``), and multiple choice (``choices``). Each turns the loader's ``(epoch, sample
indices)`` into one micro-batch (``bertforge.data.batch`` lists its keys)."""
