"""Tool calling: OpenAI's `tools` / `tool_choice` / `parallel_tool_calls` for the chat template, the
parser and the grammar.

- `tools` go to the chat template (Qwen's renders them in the system turn and asks for
  `<tool_call>` blocks); the answer's blocks are parsed into tool calls (text/channels.py,
  text/detokenize.py).
- `tool_choice`: "auto" (the model decides; nothing enforced), "none" (tools neither offered nor
  parsed), "required" (the answer is tool calls, any of the tools) or {"type": "function",
  "function": {"name": N}} (one call of N): the last two are enforced by a grammar over Qwen's
  format (ar/grammar.py's `tool_calls`), so even a model that would not call a tool does.
- `parallel_tool_calls` false: at most one call.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from triton_omni.runtime.errors import InvalidInput

MAX_TOOLS = 128


@dataclass
class ToolRequest:
    rendered: list[dict] = field(default_factory=list)     # for the chat template (OpenAI's form)
    grammar: dict | None = None                            # guided_decoding that enforces the choice
    parse_calls: bool = False

    @classmethod
    def parse(cls, tools: Any, choice: str | None, parallel: bool = True) -> "ToolRequest":
        if tools is None:
            if choice not in (None, "", "auto", "none"):
                raise InvalidInput("tool_choice", "needs 'tools'")
            return cls()
        if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
            raise InvalidInput("tools", f"expected a list of at most {MAX_TOOLS} tools")
        funcs = []
        for i, t in enumerate(tools):
            fn = t.get("function") if isinstance(t, dict) and t.get("type", "function") == "function" else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
                raise InvalidInput(f"tools[{i}]", "expected {type: function, function: {name, parameters}}")
            params = fn.get("parameters")
            if params is not None and not isinstance(params, dict):
                raise InvalidInput(f"tools[{i}].function.parameters", "expected a JSON Schema object")
            funcs.append(fn)
        if not funcs:
            return cls()
        choice = _choice(choice)
        if choice == "none":
            return cls()
        specs = [{"name": f["name"], "parameters": f.get("parameters") or {"type": "object"}} for f in funcs]
        grammar = None
        if choice == "required":
            grammar = {"tool_calls": {"tools": specs, "parallel": bool(parallel)}}
        elif choice != "auto":
            named = [s for s in specs if s["name"] == choice]
            if not named:
                raise InvalidInput("tool_choice", f"names the function {choice!r}, which is not in 'tools' "
                                   f"({', '.join(s['name'] for s in specs)})")
            grammar = {"tool_calls": {"tools": named, "parallel": False}}
        return cls([{"type": "function", "function": f} for f in funcs], grammar, True)

    @staticmethod
    def history_calls(calls: Any, where: str) -> list[dict]:
        """An assistant message's earlier tool calls, for the template (arguments as an object)."""
        if not isinstance(calls, list):
            raise InvalidInput(where, "expected a list of tool calls")
        out = []
        for i, c in enumerate(calls):
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise InvalidInput(f"{where}[{i}]", "expected {id, type: function, function: {name, arguments}}")
            args = fn.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args) if args.strip() else {}
                except ValueError:
                    raise InvalidInput(f"{where}[{i}].function.arguments", "not valid JSON") from None
            out.append({"id": c.get("id", ""), "type": "function", "function": {"name": fn["name"], "arguments": args}})
        return out


def _choice(raw: str | None) -> str:
    """"auto" / "none" / "required", or the named function's name."""
    if raw in (None, ""):
        return "auto"
    if raw.lstrip().startswith("{"):
        try:
            obj = json.loads(raw)
        except ValueError:
            raise InvalidInput("tool_choice", "not valid JSON") from None
        name = (obj.get("function") or {}).get("name") if isinstance(obj, dict) else None
        if not isinstance(name, str) or not name:
            raise InvalidInput("tool_choice", "expected {type: function, function: {name}}")
        return name
    if raw not in ("auto", "none", "required"):
        raise InvalidInput("tool_choice", f"expected auto, none, required or a function, got {raw[:40]!r}")
    return raw


def parse_call(text: str) -> dict | None:
    """One `<tool_call>` block's body as {name, arguments (JSON text)}, or None if it is not one."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return {"name": obj["name"], "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}
