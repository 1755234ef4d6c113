"""own-clientapp-fedper: a ClientApp of its own, personalized by pflower's FedPer."""
