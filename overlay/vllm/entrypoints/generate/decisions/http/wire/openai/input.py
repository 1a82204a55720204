# SPDX-License-Identifier: Apache-2.0
"""OpenAI's decision input (a string, or a list of messages and tool items) and question
instructions (a string, or a list of parts), validated strictly and rendered as one text.

Rendering is deterministic: the same input always gives the same text, so the same state shares
its prefix-cache blocks. A user message is its text; other roles and tool items get a short label
so the model can tell them apart. JSON parts render as indented JSON, as a Jev JSON state does.
Images are refused: the served model reads text.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
)

from vllm.entrypoints.generate.decisions.decide.budget import RenderBudget
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError, shown
from vllm.entrypoints.generate.decisions.decide.questions import content_text
from vllm.entrypoints.generate.decisions.decide.validation import validation_message


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CacheBreakpoint(Strict):
    mode: Literal["explicit"]


class TextPart(Strict):
    type: Literal["input_text"]
    text: str
    # Accepted for compatibility; vLLM's prefix cache finds shared prefixes by itself.
    prompt_cache_breakpoint: CacheBreakpoint | None = None


class ImagePart(Strict):
    type: Literal["input_image"]
    image_url: str
    detail: Literal["low", "high", "auto", "original"] | None = None
    prompt_cache_breakpoint: CacheBreakpoint | None = None


class JsonPart(Strict):
    type: Literal["input_json"]
    data: dict[str, Any] | list[dict[str, Any]]


class OutputTextPart(Strict):
    type: Literal["output_text"]
    text: str


class RefusalPart(Strict):
    type: Literal["refusal"]
    refusal: str


UserPart = Annotated[TextPart | ImagePart | JsonPart, Field(discriminator="type")]
AssistantPart = Annotated[OutputTextPart | RefusalPart, Field(discriminator="type")]
ToolOutputPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]
QuestionPart = Annotated[TextPart | ImagePart | JsonPart, Field(discriminator="type")]
Status = Literal["in_progress", "completed", "incomplete"]


class UserMessage(Strict):
    role: Literal["user"]
    type: Literal["message"] = "message"
    content: str | list[UserPart]


class InstructionMessage(Strict):
    role: Literal["developer", "system"]
    type: Literal["message"] = "message"
    content: str | list[TextPart]


class AssistantMessage(Strict):
    role: Literal["assistant"]
    type: Literal["message"] = "message"
    content: str | list[AssistantPart]
    phase: Literal["commentary", "final_answer"] | None = None


class ToolCall(Strict):
    type: Literal["function_call", "custom_tool_call"]
    call_id: str
    name: str
    arguments: str | None = None
    input: str | None = None
    id: str | None = None
    namespace: str | None = None
    status: Status | None = None


class ToolOutput(Strict):
    type: Literal["function_call_output", "custom_tool_call_output"]
    call_id: str
    output: str | list[ToolOutputPart]
    id: str | None = None
    status: Status | None = None


def item_kind(item: Any) -> str | None:
    """The tag that picks an input item's model: its role for messages, else its type."""
    kind = item.get("type", "message") if isinstance(item, dict) else None
    # a JSON object or list can't name a kind (nor be a dict key)
    if not isinstance(kind, str):
        return None
    if kind == "message" and isinstance(role := item.get("role"), str):
        return {
            "user": "user",
            "assistant": "assistant",
            "developer": "instruction",
            "system": "instruction",
        }.get(role)
    return {
        "function_call": "call",
        "custom_tool_call": "call",
        "function_call_output": "output",
        "custom_tool_call_output": "output",
    }.get(kind)


InputItem = Annotated[
    Annotated[UserMessage, Tag("user")]
    | Annotated[InstructionMessage, Tag("instruction")]
    | Annotated[AssistantMessage, Tag("assistant")]
    | Annotated[ToolCall, Tag("call")]
    | Annotated[ToolOutput, Tag("output")],
    Discriminator(
        item_kind,
        custom_error_type="input_item",
        custom_error_message="expected a message with role user, developer, system or assistant, or a "
        "function_call, function_call_output, custom_tool_call or custom_tool_call_output item",
    ),
]
INPUT_ITEM = TypeAdapter(InputItem)


def parse_items(items: list[Any]) -> list[Any]:
    """Each input item validated on its own, so an error names ``input[i].field`` exactly."""
    parsed = []
    for index, raw in enumerate(items):
        try:
            parsed.append(INPUT_ITEM.validate_python(raw))
        except ValidationError as exc:
            raise DecisionError(
                validation_message(exc, f"input[{index}]", skip_first=True)
            ) from None
    return parsed


def parts_text(parts: str | list[Any], where: str, budget: RenderBudget) -> str:
    """Text, JSON and assistant parts joined in order, one per line; an image is refused. A JSON part
    renders within the request's ``budget``."""
    if isinstance(parts, str):
        return parts
    texts = []
    for index, part in enumerate(parts):
        if isinstance(part, ImagePart):
            raise DecisionError(
                f"{where}[{index}]: text input only; this server's model does not read images"
            )
        if isinstance(part, JsonPart):
            texts.append(content_text(part.data, budget))
        elif isinstance(part, RefusalPart):
            texts.append(part.refusal)
        else:
            texts.append(part.text)
    return "\n".join(texts)


def render_input(items: list[Any], budget: RenderBudget) -> str:
    """Input items as one text, blocks separated by a blank line; tool outputs must follow their call."""
    calls: set[str] = set()
    blocks = []
    for index, item in enumerate(items):
        where = f"input[{index}]"
        if isinstance(item, (UserMessage, InstructionMessage, AssistantMessage)):
            text = parts_text(item.content, f"{where}.content", budget)
            user = isinstance(item, UserMessage)
            blocks.append(text if user else f"{item.role.capitalize()}: {text}")
        elif isinstance(item, ToolCall):
            calls.add(item.call_id)
            body = item.arguments if item.type == "function_call" else item.input
            if body is None:
                field = "arguments" if item.type == "function_call" else "input"
                raise DecisionError(f"{where}.{field}: required for a {item.type} item")
            blocks.append(f"Tool call {item.name} ({item.call_id}): {body}")
        else:
            if item.call_id not in calls:
                raise DecisionError(
                    f"{where}.call_id: no earlier tool call has call_id {shown(item.call_id)}"
                )
            blocks.append(
                f"Tool output ({item.call_id}): {parts_text(item.output, f'{where}.output', budget)}"
            )
    return "\n\n".join(blocks)
