"""What pflower writes from finished runs: ``pflower report``, the leaderboard, the claims page
and the generated methods list. Reads run directories and configs; never starts a run except
the leaderboard's missing ones, through :mod:`pflower.simulation`."""
