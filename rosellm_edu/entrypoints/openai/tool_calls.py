# Generated from notebooks/13a_structured_server.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import json
import re

from rosellm_edu.entrypoints.openai.constraints import Constraint
from rosellm_edu.entrypoints.openai.errors import OpenAIError
from rosellm_edu.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage, ChatTool, NamedToolChoice
from rosellm_edu.sampling_params import StructuredOutputsParams


# notebooks/13a_structured_server.ipynb, cell 19
def tool_choice(body: ChatCompletionRequest) -> str:
    """none, auto, required, or function (one named): OpenAI's default is auto with tools, none without."""
    if not body.tools:
        return "none"
    return "function" if isinstance(body.tool_choice, NamedToolChoice) else body.tool_choice or "auto"


# notebooks/13a_structured_server.ipynb, cell 19
def check_tools(body: ChatCompletionRequest) -> None:
    """A 400 naming the field for tools no answer could call: arguments that are not an object, two tools of one
    name, a tool_choice that names no tool or asks for a call without tools."""
    names = []
    for i, tool in enumerate(body.tools or []):
        kind = (tool.function.parameters or {}).get("type", "object")
        if kind != "object":
            raise OpenAIError(400, f"tools.{i}.function.parameters: the arguments are a JSON object, so their schema "
                              f"has type object, not {kind!r}", f"tools.{i}.function.parameters")
        if tool.function.name in names:
            raise OpenAIError(400, f"tools.{i}.function.name: {tool.function.name!r} names an earlier tool too",
                              f"tools.{i}.function.name")
        names.append(tool.function.name)
    if body.tool_choice not in (None, "none", "auto") and not names:
        raise OpenAIError(400, "tool_choice: asks for a tool call, but the request has no tools", "tool_choice")
    if isinstance(body.tool_choice, NamedToolChoice) and body.tool_choice.function.name not in names:
        raise OpenAIError(400, f"tool_choice: no tool is named {body.tool_choice.function.name!r} (tools: "
                          f"{', '.join(names)})", "tool_choice")


# notebooks/13a_structured_server.ipynb, cell 20
def arguments_schema(tool: ChatTool) -> dict:
    return tool.function.parameters or {"type": "object", "properties": {}}


# notebooks/13a_structured_server.ipynb, cell 20
def required_schema(tools: list[ChatTool], parallel: bool) -> dict:
    """vLLM's schema for tool_choice required: a list of calls, each one tool's name and its arguments."""
    calls = [{"properties": {"name": {"type": "string", "enum": [t.function.name]},
                             "parameters": arguments_schema(t)}, "required": ["name", "parameters"]} for t in tools]
    schema = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": calls}}
    if not parallel:
        schema["maxItems"] = 1
    defs = {}   # a tool's {"$ref": "#/$defs/X"} points at the root: its $defs go there
    for i, tool in enumerate(tools):
        for name, definition in arguments_schema(tool).get("$defs", {}).items():
            if defs.setdefault(name, definition) != definition:
                raise OpenAIError(400, f"tools.{i}.function.parameters: $defs.{name} differs from an earlier tool's",
                                  f"tools.{i}.function.parameters")
    return schema | ({"$defs": defs} if defs else {})


# notebooks/13a_structured_server.ipynb, cell 20
def tool_constraints(body: ChatCompletionRequest) -> list[Constraint]:
    """A named tool_choice: the answer is that tool's arguments; required: a list of calls; else nothing."""
    mode, tools = tool_choice(body), body.tools or []
    if mode == "function":
        i = next(i for i, t in enumerate(tools) if t.function.name == body.tool_choice.function.name)
        return [Constraint(StructuredOutputsParams(json=arguments_schema(tools[i])), f"tools.{i}.function.parameters")]
    if mode != "required":
        return []
    parts = [(f"tools.{i}.function.parameters", StructuredOutputsParams(json=arguments_schema(t)))
             for i, t in enumerate(tools)]
    schema = required_schema(tools, parallel=body.parallel_tool_calls is not False)
    return [Constraint(StructuredOutputsParams(json=schema), "tools", parts)]


# notebooks/13a_structured_server.ipynb, cell 23
# The Hermes format's system prompt for tools (NousResearch's Hermes 2 Pro; Qwen2.5's chat template writes the same).
HERMES_TOOLS = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


# notebooks/13a_structured_server.ipynb, cell 24
def hermes_message(message: ChatMessage) -> dict:
    """A message as a chat template without tools can write it: earlier calls and tool results as Hermes text."""
    m = message.for_template()
    if message.role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
    calls = [f'<tool_call>\n{{"name": {json.dumps(c.function.name)}, "arguments": {c.function.arguments or "{}"}}}'
             f"\n</tool_call>" for c in message.tool_calls or []]
    return {k: v for k, v in m.items() if k != "tool_calls"} | {"content": "\n".join([m["content"], *calls]).strip()}


# notebooks/13a_structured_server.ipynb, cell 24
def template_messages(body: ChatCompletionRequest) -> list[dict]:
    """The messages for the chat template: the tools described in the system message (unless tool_choice is none),
    the history in the Hermes format."""
    messages = [hermes_message(m) for m in body.messages]
    if tool_choice(body) == "none":
        return messages
    section = HERMES_TOOLS.format(tools="\n".join(json.dumps(t.model_dump(exclude_none=True)) for t in body.tools))
    if messages[0]["role"] == "system":
        return [messages[0] | {"content": messages[0]["content"] + "\n\n" + section}] + messages[1:]
    return [{"role": "system", "content": section}] + messages


# notebooks/13a_structured_server.ipynb, cell 27
TAG = "<tool_call>"


# notebooks/13a_structured_server.ipynb, cell 27
TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)   # the last one may be cut off


# notebooks/13a_structured_server.ipynb, cell 27
def hermes_calls(text: str, tools: set[str]) -> tuple[str | None, list[tuple[str, str]]] | None:
    """(the text before the calls, [(name, arguments as JSON)]) if the answer holds <tool_call> blocks of known
    tools, each a JSON object {"name", "arguments"} or a list of them; None if it is text."""
    calls = []
    for block in TOOL_CALL.findall(text):
        try:
            found = json.loads(block)
        except json.JSONDecodeError:
            return None
        for call in found if isinstance(found, list) else [found]:
            arguments = call.get("arguments", call.get("parameters")) if isinstance(call, dict) else None
            if not isinstance(arguments, dict) or call.get("name") not in tools:
                return None
            calls.append((call["name"], json.dumps(arguments, ensure_ascii=False)))
    return (text[:text.index(TAG)].strip() or None, calls) if calls else None


# notebooks/13a_structured_server.ipynb, cell 27
def text_before_calls(text: str) -> int:
    """How much of a streamed answer is surely text: up to a <tool_call>, or to a tail that may begin one."""
    if (at := text.find(TAG)) >= 0:
        return at
    return next((len(text) - k for k in range(len(TAG) - 1, 0, -1) if text.endswith(TAG[:k])), len(text))


# notebooks/13a_structured_server.ipynb, cell 30
CALL_HEAD = re.compile(r'\{\s*"name"\s*:\s*"(?P<name>[^"]*)"\s*,\s*"parameters"\s*:')


# notebooks/13a_structured_server.ipynb, cell 30
def item_spans(text: str) -> list[list[int | None]]:
    """[start, end) of each item of a JSON list, or a prefix of one; end is None while an item is unfinished."""
    spans, depth, in_string, escaped = [], 0, False, False
    for i, ch in enumerate(text):
        if in_string:
            escaped, in_string = (not escaped and ch == "\\"), escaped or ch != '"'
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth == 2:
                spans.append([i, None])
        elif ch in "]}":
            depth -= 1
            if depth == 1:
                spans[-1][1] = i + 1
    return spans


# notebooks/13a_structured_server.ipynb, cell 30
def array_calls(text: str) -> list[tuple[str | None, str]]:
    """The calls in (a prefix of) tool_choice required's answer: [{"name": ..., "parameters": {...}}, ...].
    Each call's name (None until written) and its arguments' text so far. The grammar writes name first."""
    calls = []
    for start, end in item_spans(text):
        item = text[start:end]                      # end None: to the end of the text
        head = CALL_HEAD.match(item)
        if head is None:
            calls.append((None, ""))
            continue
        calls.append((head["name"], item[head.end():-1 if end else None].strip()))
    return calls
