"""The shapes of what :class:`pyllama.Llama` takes and returns, as TypedDicts under
llama-cpp-python's names (its ``llama_cpp.llama_types``), which follow the OpenAI API:
completions, chat completions (and their stream chunks), embeddings, chat messages, tools.

They only describe dicts; nothing checks them at run time. Keys a response may omit are in
``total=False`` bases (Python 3.9 has no ``NotRequired``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, TypedDict, Union

JsonType = Union[None, int, str, bool, List[Any], Dict[str, Any]]

# -- embeddings ------------------------------------------------------------------------------


class EmbeddingUsage(TypedDict):
    prompt_tokens: int
    total_tokens: int


class Embedding(TypedDict):
    index: int
    object: str
    embedding: Union[List[float], List[List[float]]]  # one vector, or one per token (no pooling)


class CreateEmbeddingResponse(TypedDict):
    object: Literal["list"]
    model: str
    data: List[Embedding]
    usage: EmbeddingUsage


# -- completions -----------------------------------------------------------------------------


class CompletionLogprobs(TypedDict):
    text_offset: List[int]  # character offset of each token in the returned text (+ prompt)
    token_logprobs: List[Optional[float]]
    tokens: List[str]
    top_logprobs: List[Optional[Dict[str, float]]]  # token text -> log-probability


class CompletionChoice(TypedDict):
    text: str
    index: int
    logprobs: Optional[CompletionLogprobs]
    finish_reason: Optional[Literal["stop", "length"]]


class CompletionUsage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class _CreateCompletionResponseBase(TypedDict):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: List[CompletionChoice]


class CreateCompletionResponse(_CreateCompletionResponseBase, total=False):
    usage: CompletionUsage  # on the whole response, and on the last chunk of a stream


# -- chat completions: responses -------------------------------------------------------------


class ChatCompletionResponseFunctionCall(TypedDict):
    name: str
    arguments: str  # JSON text


class ChatCompletionMessageToolCallFunction(TypedDict):
    name: str
    arguments: str


class ChatCompletionMessageToolCall(TypedDict):
    id: str
    type: Literal["function"]
    function: ChatCompletionMessageToolCallFunction


ChatCompletionMessageToolCalls = List[ChatCompletionMessageToolCall]


class _ChatCompletionResponseMessageBase(TypedDict):
    role: Literal["assistant", "function"]
    content: Optional[str]


class ChatCompletionResponseMessage(_ChatCompletionResponseMessageBase, total=False):
    tool_calls: ChatCompletionMessageToolCalls
    function_call: ChatCompletionResponseFunctionCall  # deprecated by OpenAI for tool_calls


class _ChatCompletionFunctionBase(TypedDict):
    name: str
    parameters: Dict[str, JsonType]  # a JSON schema


class ChatCompletionFunction(_ChatCompletionFunctionBase, total=False):
    description: str


class ChatCompletionTopLogprobToken(TypedDict):
    token: str
    logprob: float
    bytes: Optional[List[int]]


class ChatCompletionLogprobToken(ChatCompletionTopLogprobToken):
    top_logprobs: List[ChatCompletionTopLogprobToken]


class ChatCompletionLogprobs(TypedDict):
    content: Optional[List[ChatCompletionLogprobToken]]
    refusal: Optional[List[ChatCompletionLogprobToken]]


class _ChatCompletionResponseChoiceBase(TypedDict):
    index: int
    message: ChatCompletionResponseMessage
    finish_reason: Optional[str]  # "stop", "length", "tool_calls", "function_call"


class ChatCompletionResponseChoice(_ChatCompletionResponseChoiceBase, total=False):
    logprobs: Optional[ChatCompletionLogprobs]


class CreateChatCompletionResponse(TypedDict):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: List[ChatCompletionResponseChoice]
    usage: CompletionUsage


# -- chat completions: stream chunks ---------------------------------------------------------


class ChatCompletionMessageToolCallChunkFunction(TypedDict):
    name: Optional[str]
    arguments: str


class _ChatCompletionMessageToolCallChunkBase(TypedDict):
    index: int
    function: ChatCompletionMessageToolCallChunkFunction


class ChatCompletionMessageToolCallChunk(_ChatCompletionMessageToolCallChunkBase, total=False):
    id: str
    type: Literal["function"]


class ChatCompletionStreamResponseDeltaEmpty(TypedDict):
    pass


class ChatCompletionStreamResponseDeltaFunctionCall(TypedDict):
    name: str
    arguments: str


class ChatCompletionStreamResponseDelta(TypedDict, total=False):
    content: Optional[str]
    function_call: ChatCompletionStreamResponseDeltaFunctionCall
    tool_calls: List[ChatCompletionMessageToolCallChunk]
    role: Optional[Literal["system", "user", "assistant", "tool"]]


class _ChatCompletionStreamResponseChoiceBase(TypedDict):
    index: int
    delta: Union[ChatCompletionStreamResponseDelta, ChatCompletionStreamResponseDeltaEmpty]
    finish_reason: Optional[str]


class ChatCompletionStreamResponseChoice(_ChatCompletionStreamResponseChoiceBase, total=False):
    logprobs: Optional[ChatCompletionLogprobs]


class CreateChatCompletionStreamResponse(TypedDict):
    id: str
    model: str
    object: Literal["chat.completion.chunk"]
    created: int
    choices: List[ChatCompletionStreamResponseChoice]


# -- chat completions: requests --------------------------------------------------------------


class _ChatCompletionFunctionsBase(TypedDict):
    name: str
    parameters: Dict[str, JsonType]


class ChatCompletionFunctions(_ChatCompletionFunctionsBase, total=False):
    description: str


class ChatCompletionFunctionCallOption(TypedDict):
    name: str


class _ChatCompletionRequestResponseFormatBase(TypedDict):
    type: Literal["text", "json_object"]


class ChatCompletionRequestResponseFormat(_ChatCompletionRequestResponseFormatBase, total=False):
    schema: JsonType  # with type "json_object": the JSON schema the reply must follow


class ChatCompletionRequestMessageContentPartText(TypedDict):
    type: Literal["text"]
    text: str


class _ImageUrlBase(TypedDict):
    url: str


class ChatCompletionRequestMessageContentPartImageImageUrl(_ImageUrlBase, total=False):
    detail: Literal["auto", "low", "high"]


class ChatCompletionRequestMessageContentPartImage(TypedDict):
    type: Literal["image_url"]
    image_url: Union[str, ChatCompletionRequestMessageContentPartImageImageUrl]


ChatCompletionRequestMessageContentPart = Union[
    ChatCompletionRequestMessageContentPartText,
    ChatCompletionRequestMessageContentPartImage,
]


class ChatCompletionRequestSystemMessage(TypedDict):
    role: Literal["system"]
    content: Optional[str]


class ChatCompletionRequestUserMessage(TypedDict):
    role: Literal["user"]
    content: Optional[Union[str, List[ChatCompletionRequestMessageContentPart]]]


class ChatCompletionRequestAssistantMessageFunctionCall(TypedDict):
    name: str
    arguments: str


class _ChatCompletionRequestAssistantMessageBase(TypedDict):
    role: Literal["assistant"]


class ChatCompletionRequestAssistantMessage(_ChatCompletionRequestAssistantMessageBase, total=False):
    content: Optional[str]
    tool_calls: ChatCompletionMessageToolCalls
    function_call: ChatCompletionRequestAssistantMessageFunctionCall


class ChatCompletionRequestToolMessage(TypedDict):
    role: Literal["tool"]
    content: Optional[str]
    tool_call_id: str


class ChatCompletionRequestFunctionMessage(TypedDict):
    role: Literal["function"]
    content: Optional[str]
    name: str


ChatCompletionRequestMessage = Union[
    ChatCompletionRequestSystemMessage,
    ChatCompletionRequestUserMessage,
    ChatCompletionRequestAssistantMessage,
    ChatCompletionRequestToolMessage,
    ChatCompletionRequestFunctionMessage,
]


class ChatCompletionRequestFunctionCallOption(TypedDict):
    name: str


ChatCompletionRequestFunctionCall = Union[Literal["none", "auto"], ChatCompletionRequestFunctionCallOption]

ChatCompletionFunctionParameters = Dict[str, JsonType]


class _ChatCompletionToolFunctionBase(TypedDict):
    name: str
    parameters: ChatCompletionFunctionParameters


class ChatCompletionToolFunction(_ChatCompletionToolFunctionBase, total=False):
    description: str


class ChatCompletionTool(TypedDict):
    type: Literal["function"]
    function: ChatCompletionToolFunction


class ChatCompletionNamedToolChoiceFunction(TypedDict):
    name: str


class ChatCompletionNamedToolChoice(TypedDict):
    type: Literal["function"]
    function: ChatCompletionNamedToolChoiceFunction


ChatCompletionToolChoiceOption = Union[Literal["none", "auto", "required"], ChatCompletionNamedToolChoice]

# llama-cpp-python's older / OpenAI-SDK-style names for the same shapes
EmbeddingData = Embedding
CompletionChunk = CreateCompletionResponse
Completion = CreateCompletionResponse
CreateCompletionStreamResponse = CreateCompletionResponse
ChatCompletionMessage = ChatCompletionResponseMessage
ChatCompletionChoice = ChatCompletionResponseChoice
ChatCompletion = CreateChatCompletionResponse
ChatCompletionChunkDeltaEmpty = ChatCompletionStreamResponseDeltaEmpty
ChatCompletionChunkChoice = ChatCompletionStreamResponseChoice
ChatCompletionChunkDelta = ChatCompletionStreamResponseDelta
ChatCompletionChunk = CreateChatCompletionStreamResponse
ChatCompletionStreamResponse = CreateChatCompletionStreamResponse
ChatCompletionResponseFunction = ChatCompletionFunction
ChatCompletionFunctionCall = ChatCompletionResponseFunctionCall

__all__ = [n for n in dir() if n[0].isupper()
           and n not in ("Any", "Dict", "List", "Literal", "Optional", "TypedDict", "Union")]
