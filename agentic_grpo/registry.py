"""A registry by name: the one home of a pluggable vocabulary (stages, prompt formats, sources).

Each registry lives next to what it registers (`agent.stages.STAGES`, `agent.prompts.
PROMPT_FORMATS`, `tasks.sources.TASK_SOURCES`); `config` validates option strings against
`registry.names()`, so a new entry is one decorated definition and nothing else to retype.

    STAGES = registry.Registry("workflow stage")

    @STAGES.register("code")
    class CodeStage(Stage): ...

    STAGES.get("code")   # -> CodeStage
    STAGES.get("cod")    # ValueError: unknown workflow stage 'cod'; registered: ('code',)
"""

from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
  """Names -> registered objects (classes or factories), in registration order.

  Args:
    kind: what is registered, for error messages (`"workflow stage"`, `"task source"`).
  """

  def __init__(self, kind: str):
    self.kind = kind
    self._entries: dict[str, T] = {}

  def register(self, name: str) -> Callable[[T], T]:
    """Returns a decorator that registers its argument under `name` and returns it unchanged.

    Raises:
      ValueError: if `name` is not a non-empty string or is already registered.
    """
    if not isinstance(name, str) or not name:
      raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
    if name in self._entries:
      raise ValueError(f"{self.kind} {name!r} is already registered")

    def decorator(obj: T) -> T:
      self._entries[name] = obj
      return obj
    return decorator

  def get(self, name: str) -> T:
    """The object registered under `name`.

    Raises:
      ValueError: naming the kind, the unknown name and the registered names.
    """
    if not isinstance(name, str) or name not in self._entries:
      raise ValueError(f"unknown {self.kind} {name!r}; registered: {self.names()}")
    return self._entries[name]

  def names(self) -> tuple[str, ...]:
    """Registered names, in registration order."""
    return tuple(self._entries)

  def __contains__(self, name: object) -> bool:
    return isinstance(name, str) and name in self._entries
