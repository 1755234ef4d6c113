"""The strategy base and its parts: what every method shares.

:class:`~pflower.strategies.base.strategy.PersonalizedStrategy` is the Flower ``Strategy`` every
method subclasses; the modules beside it are its parts (the run loop, the message builder, the
client directory, resume and checkpoints, validation of replies, evaluation, the round log) and
the options dataclass a method declares its options with. A method's own file lives one folder up.
"""
