"""quickstart-pytorch: a Flower / PyTorch app (offline copy of the quickstart's shape)."""
