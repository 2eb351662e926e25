"""What the example scripts share: the run flow, presets, checkpoints, metrics, model cards, publishing, data loading
defaults, and the image-classification pieces of two scripts."""
