"""A run's task: a string, or a list of strings, images and documents, as its first turn."""

from __future__ import annotations

from anabranch.context._content import attachment_note
from anabranch.errors import UserError
from anabranch.messages import Block, Document, Image, Message, TextBlock

__all__ = ["task_message", "task_text"]


def task_message(task: object) -> Message:
    """The first user turn of a run: a string, or a list of strings, images and documents.

    Raises ``UserError`` (one line) for anything else, before a session exists.
    """
    if isinstance(task, str):
        if not task.strip():
            raise UserError("the task must be a non-empty string")
        return Message.user(task)
    if not isinstance(task, list | tuple) or not task:
        raise UserError(
            "the task must be a non-empty string or a list of strings, Image and Document"
        )
    blocks: list[Block] = []
    for index, item in enumerate(task):
        if isinstance(item, str):
            if item.strip():
                blocks.append(TextBlock(text=item))
        elif isinstance(item, Image | Document):
            blocks.append(item)
        else:
            raise UserError(
                f"task item {index} is a {type(item).__name__}: a task list holds strings, "
                "Image and Document"
            )
    if not blocks:
        raise UserError("the task list holds no text, image or document")
    return Message(role="user", content=tuple(blocks))


def task_text(message: Message) -> str:
    """The task as one line of text for listings (images and documents as notes)."""
    parts = [
        b.text if isinstance(b, TextBlock) else attachment_note(b)
        for b in message.content
        if isinstance(b, TextBlock | Image | Document)
    ]
    return " ".join(parts)
