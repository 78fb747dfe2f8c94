"""The governed runtime: agents, models, tools, tasks, chat sessions."""

from apollia_nb.runtime.runtime import Runtime, TaskHandle

__all__ = ["Runtime", "TaskHandle"]
