"""A training run's pieces (paper §5): the schedule, the loss, the jitted steps, checkpoints,
averaging, branching, the workdir and its metrics. Imports the layers below it.
"""
