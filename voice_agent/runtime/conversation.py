"""The committed dialogue in OpenAI chat format; agent replies stay pending until heard."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

UNFINISHED_RESULT = json.dumps({"error": "interrupted before it finished"})


@dataclass(frozen=True)
class ToolCallRecord:
    call_id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class CommitOutcome:
    generated: str
    committed: str | None  # None: nothing of the reply stays in the context


class Conversation:
    """Messages in the order they happened; pending agent text is provisional until committed.

    A pending reply is already in `messages`, so a tool loop inside one turn sends the LLM
    what it said so far; `commit` later cuts it to the words the caller heard.
    """

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self._pending: dict[int, dict[str, Any]] = {}
        self._slots: dict[str, dict[str, Any]] = {}

    def add_user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def amend_last_user(self, text: str) -> bool:
        """The caller's last message becomes `text` (they went on after a pause); False if
        there is none."""
        for message in reversed(self.messages):
            if message["role"] == "user":
                message["content"] = text
                return True
        return False

    def start_reply(self, reply_id: int) -> None:
        message: dict[str, Any] = {"role": "assistant", "content": ""}
        self.messages.append(message)
        self._pending[reply_id] = message

    def extend_reply(self, reply_id: int, text: str) -> None:
        self._pending[reply_id]["content"] += text

    def reply_text(self, reply_id: int) -> str:
        return str(self._pending[reply_id].get("content") or "")

    def is_pending(self, reply_id: int) -> bool:
        return reply_id in self._pending

    def pending_ids(self) -> list[int]:
        return list(self._pending)

    def open_tool_calls(
        self, calls: Sequence[ToolCallRecord], *, reply_id: int | None = None
    ) -> None:
        """Tool calls and a result slot each, in OpenAI order: results must follow their call.

        What runs while the calls execute (a trigger's respond, an override) lands after the
        slots, so the history stays valid even when the turn is cut off mid-way.
        """
        entries = [
            {
                "id": call.call_id,
                "type": "function",
                "function": {
                    "name": call.name,
                    "arguments": json.dumps(call.arguments, ensure_ascii=False),
                },
            }
            for call in calls
        ]
        if reply_id is not None and reply_id in self._pending:
            self._pending[reply_id]["tool_calls"] = entries
        else:
            self.messages.append({"role": "assistant", "content": None, "tool_calls": entries})
        for call in calls:
            slot = {"role": "tool", "tool_call_id": call.call_id, "content": UNFINISHED_RESULT}
            self.messages.append(slot)
            self._slots[call.call_id] = slot

    def set_tool_result(self, call_id: str, content: str) -> None:
        self._slots.pop(call_id)["content"] = content

    def close_unfinished(self) -> None:
        """After a cancelled turn: slots keep the 'interrupted' text, which is what happened."""
        self._slots.clear()

    def commit(self, reply_id: int, heard: str | None) -> CommitOutcome:
        message = self._pending.pop(reply_id)
        generated = str(message.get("content") or "")
        heard = (heard or "").strip()
        if heard:
            message["content"] = heard
            return CommitOutcome(generated, heard)
        if message.get("tool_calls"):
            message["content"] = None
        else:
            self.messages.remove(message)
        return CommitOutcome(generated, None)

    def keep_last(self, count: int | None) -> None:
        """Trim for a transfer; never start on a tool result whose call was trimmed away."""
        if count is None:
            return
        if count == 0:
            self.messages.clear()
            return
        kept = self.messages[-count:]
        while kept and kept[0]["role"] == "tool":
            kept.pop(0)
        self.messages[:] = kept

    def snapshot(self) -> list[dict[str, Any]]:
        """A copy without actions still running: their calls appear once their results do."""
        if not self._slots:
            return copy.deepcopy(self.messages)
        return self._view(committed_only=False)

    def committed(self) -> list[dict[str, Any]]:
        """`snapshot` without the text of replies not yet committed (their tool calls stay):
        what a copy of the conversation kept elsewhere may hold (brains/realtime.py)."""
        return self._view(committed_only=True)

    def _view(self, *, committed_only: bool) -> list[dict[str, Any]]:
        running_slots = {id(slot) for slot in self._slots.values()}
        pending = {id(m) for m in self._pending.values()} if committed_only else set()
        view: list[dict[str, Any]] = []
        for original in self.messages:
            if id(original) in running_slots:
                continue
            message = copy.deepcopy(original)
            if "tool_calls" in message:
                calls = [c for c in message["tool_calls"] if c["id"] not in self._slots]
                if calls:
                    message["tool_calls"] = calls
                else:
                    del message["tool_calls"]
                    if not message.get("content"):
                        continue
            if id(original) in pending:
                if not message.get("tool_calls"):
                    continue
                message["content"] = None
            view.append(message)
        return view

    def last_content(self, role: str) -> str | None:
        for message in reversed(self.messages):
            if message["role"] == role and message.get("content"):
                return str(message["content"])
        return None
