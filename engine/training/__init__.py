"""Building the shipped default model: corpus, tokenizer, tiny configs and the training loop."""
