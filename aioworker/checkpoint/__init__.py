"""Model name, .gguf file or directory -> a model directory with its config and tokenizer."""
