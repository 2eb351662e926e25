"""What the example scripts share: metrics, model cards, publishing, checkpoint paths, data loading defaults."""
