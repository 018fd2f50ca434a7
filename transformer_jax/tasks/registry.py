"""The tasks by name: `data.task` chooses one (as big_vision chooses evaluators by name).

A new task is a base.Task subclass in its own folder under tasks/ and one entry in TASKS.
"""

from __future__ import annotations

import ml_collections

from transformer_jax.runtime import dotted
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.tasks import base
from transformer_jax.tasks.parsing import task as parsing
from transformer_jax.tasks.translation import task as translation

TASKS: dict[str, base.Task] = {t.name: t for t in (translation.TASK, parsing.TASK)}


def names() -> tuple[str, ...]:
  return tuple(TASKS)


def for_name(name: str) -> base.Task:
  """The task called `name`; a one-line ConfigError naming the choices for any other."""
  try:
    return TASKS[name]
  except (KeyError, TypeError):
    raise ConfigError(f"config key 'data.task' is {name!r}; expected one of "
                      f"{', '.join(TASKS)}") from None


def get(config: ml_collections.ConfigDict) -> base.Task:
  """The task `config.data.task` names, once the config passes its checks: the task's own
  (Task.validate), and no other task's switch turned on (Task.switches)."""
  task = for_name(config.data.task)
  flat = dotted.flatten(config)
  for other in TASKS.values():
    for key, what in ({} if other is task else other.switches).items():
      if flat.get(key):
        raise ConfigError(f"config key '{key}' {what}: it needs data.task='{other.name}', got "
                          f"{task.name!r}")
  task.validate(config)
  return task
