"""The models: each folder holds the files a checkpoint copies (config, modeling, processor, input checks)."""
