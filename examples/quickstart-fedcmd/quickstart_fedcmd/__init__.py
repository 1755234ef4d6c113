"""quickstart-fedcmd: Flower's quickstart-pytorch app with pflower's FedCMD."""
