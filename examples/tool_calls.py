"""Tool calls with pyllama.Llama, in OpenAI's shape (llama-cpp-python's API): the model asks
for a tool, this program runs it, the result goes back as a "tool" message, and the model
answers with it.

    python examples/tool_calls.py [-m MODEL.gguf] ["question"]

The default model is Qwen2.5-Coder-0.5B-Instruct Q4_K_M (its chat template renders the tools
and its replies carry <tool_call> blocks; pyllama finds it through pyllama._models when the
test models are installed). With tool_choice="auto" the reply is free text until the model
opens a tool call, and constrained by the tools' JSON schemas from there on.
"""

from __future__ import annotations

import ast
import json
import operator
import sys

from pyllama import Llama

TOOLS = [
    {"type": "function", "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / ** and parentheses.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]}}},
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
]

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculator(expression: str) -> str:
    """Arithmetic only (no names, calls or attributes): parsed, not eval'd."""
    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError(f"not arithmetic: {ast.dump(node)}")
    try:
        return str(ev(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as e:
        return f"error: {e}"


def get_weather(city: str) -> str:
    # a stand-in for a weather service: this example has no network
    return json.dumps({"city": city, "temperature_c": 18, "sky": "partly cloudy"})


FUNCTIONS = {"calculator": calculator, "get_weather": get_weather}


def run(llm: Llama, question: str) -> dict:
    """One question through the tool loop; returns the transcript (for tests)."""
    messages = [{"role": "user", "content": question}]
    reply = llm.create_chat_completion(messages, tools=TOOLS, tool_choice="auto", temperature=0.0,
                                       max_tokens=128)["choices"][0]["message"]
    calls = reply.get("tool_calls") or []
    results = []
    if calls:
        messages.append({"role": "assistant", "content": reply.get("content"), "tool_calls": calls})
        for call in calls:
            fn = call["function"]
            args = json.loads(fn["arguments"])
            out = FUNCTIONS[fn["name"]](**args) if fn["name"] in FUNCTIONS else f"error: no tool {fn['name']}"
            print(f"tool call: {fn['name']}({fn['arguments']}) -> {out}")
            results.append((fn["name"], args, out))
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": out})
        # the answer: the tool results are in the conversation; no more tools on offer
        reply = llm.create_chat_completion(messages, temperature=0.0, max_tokens=128)["choices"][0]["message"]
    print(f"answer: {reply['content']}")
    return {"calls": results, "answer": reply["content"]}


def main(argv: list[str]) -> int:
    model = None
    if len(argv) >= 3 and argv[1] == "-m":
        model, argv = argv[2], [argv[0]] + argv[3:]
    if model is None:
        from pyllama._models import qwen25_coder_path

        p = qwen25_coder_path()
        if p is None:
            print("no model: pass -m MODEL.gguf (a model whose chat template renders tools, e.g. Qwen2.5)",
                  file=sys.stderr)
            return 1
        model = str(p)
    question = argv[1] if len(argv) > 1 else "What is 23 * 19? Use the calculator."
    llm = Llama(model, n_ctx=4096, verbose=False)
    run(llm, question)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
