"""pflower ServerApp: compose the config, build model and strategy, run, write results."""
