"""Tool calling in `c2c serve` (#55): how replies are read as calls, the template's whole rendering, forced
calls, streamed call deltas, refusals naming the field, and real clients on the default model."""

from __future__ import annotations

import json

import jsonschema
import pytest

from c2c.errors import ToolCallError
from c2c.conversation.tools import Tool, Tools, held_back
from serve_helpers import SYSTEM, c2c_field, chat

WEATHER = Tool(name="get_weather", description="Get the current weather in a city",
               parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
ADD = Tool(name="add", description="Add two integers",
           parameters={"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]})
TOOLS = [WEATHER.to_dict(), ADD.to_dict()]
SCHEMAS = {t.name: t.parameters for t in (WEATHER, ADD)}


def both(choice="auto", **kw) -> Tools:
    return Tools(tools=(WEATHER, ADD), choice=choice, **kw)


# ------------------------------------------------------------- reading a reply as calls
@pytest.mark.parametrize("text, content, calls", [
    ('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>', None, [("add", {"a": 1, "b": 2})]),
    ('Let me check.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>\n'
     '<tool_call>{"name": "add", "arguments": "{\\"a\\": 3, \\"b\\": 4}"}</tool_call>', "Let me check.",
     [("get_weather", {"city": "Oslo"}), ("add", {"a": 3, "b": 4})]),          # text first, arguments as a string
    ('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}', None, [("add", {"a": 1, "b": 2})]),  # unclosed
    ('```json\n{\n  "name": "get_weather",\n  "arguments": {"city": "Paris"}\n}\n```', None,
     [("get_weather", {"city": "Paris"})]),                                      # what Qwen2.5-Coder writes
    ('{"name": "add", "arguments": {"a": 17, "b": 25}}', None, [("add", {"a": 17, "b": 25})]),
    ('[{"name": "add", "parameters": {"a": 1, "b": 1}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]',
     None, [("add", {"a": 1, "b": 1}), ("get_weather", {"city": "Rome"})]),
    ('{"name": "add", "arguments": {"a": 1, "b": 1}}\n{"name": "add", "arguments": {"a": 2, "b": 2}}', None,
     [("add", {"a": 1, "b": 1}), ("add", {"a": 2, "b": 2})]),
])
def test_a_reply_is_read_as_the_calls_the_model_writes(text, content, calls):
    got_content, got = both().parse(text)
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in got] == calls
    assert len({c.id for c in got}) == len(got) and all(c.id.startswith("call_") for c in got)


@pytest.mark.parametrize("text", [
    '{"name": "cat joke", "arguments": {"cat": "Meow"}}',            # no such tool (what the model wrote, for a joke)
    '{"name": "add", "arguments": {"a": 1',                           # cut short (max_tokens)
    '<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>',    # arguments not an object
    '<tool_call>{"name": "add", "arguments": {}}</tool_call> and then some words',
    'The answer is {"name": "add"}.',                                 # prose around JSON is prose
    'Paris is sunny.',
    '',
])
def test_what_is_not_a_well_formed_call_of_a_given_tool_stays_content(text):
    assert both().parse(text) == (text, ())


def test_tool_choice_none_reads_nothing_as_a_call_and_one_call_without_parallel_calls():
    call = '{"name": "add", "arguments": {"a": 1, "b": 2}}'
    assert both("none").parse(call) == (call, ())
    _, calls = both(parallel=False).parse(call + "\n" + call)
    assert len(calls) == 1
    assert both("function", name="get_weather").parse(call) == (call, ())   # another function than the named one


@pytest.mark.parametrize("text, held", [
    ("Hello there", 0), ("Hello <tool", len("<tool")), ("Hello <", 1), ("  {\"name", len("  {\"name")),
    ("```json", 7), ("Sure. <tool_call>{", len("Sure. <tool_call>{")), ("a < b", 0),
])
def test_a_stream_holds_back_only_what_may_become_a_call(text, held):
    assert held_back(text) == held


def test_a_forced_reply_is_constrained_to_calls_whose_arguments_validate():
    named = both("function", name="add").forced_schema()
    jsonschema.validate({"name": "add", "arguments": {"a": 1, "b": 2}}, named)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "get_weather", "arguments": {"city": "x"}}, named)
    required = both("required").forced_schema()
    jsonschema.validate([{"name": "get_weather", "arguments": {"city": "x"}}], required)
    for bad in ([], [{"name": "add", "arguments": {"a": "one", "b": 2}}]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, required)


# ------------------------------------------------------------- the template renders the whole conversation
def conversations():
    from c2c.conversation.render import Message
    from c2c.conversation.tools import ToolCall

    calls = (ToolCall(id="c1", name="get_weather", arguments='{"city": "Paris"}'),
             ToolCall(id="c2", name="get_weather", arguments='{"city": "Zürich 🚀"}'))
    tool_turns = [Message(role="user", content="Weather in Paris and Zürich?"),
                  Message(role="assistant", content="", tool_calls=calls),
                  Message(role="tool", content="sunny", tool_call_id="c1", tool_name="get_weather"),
                  Message(role="tool", content="rain", tool_call_id="c2", tool_name="get_weather"),
                  Message(role="assistant", content="Paris is sunny, Zürich rainy."),
                  Message(role="user", content="And tomorrow?")]
    return {"system": [Message(role="system", content="Be brief.")] + tool_turns, "no system": tool_turns,
            "calls only": tool_turns[:4]}


@pytest.mark.zoo
def test_a_conversation_with_tools_is_the_templates_whole_rendering_cut_at_its_messages():
    """Qwen2.5's template merges consecutive tool results into one turn, so message-by-message rendering would be
    wrong there: the tokens are those of the whole rendering, and each message's part is what its own rendering
    shares with it."""
    from c2c.runtime import zoo
    from c2c.conversation.render import render

    rt = zoo.load("Qwen2.5-Coder-0.5B-Instruct")
    for name, msgs in conversations().items():
        ours = render(rt, msgs, tools=TOOLS)
        whole = rt.render_chat([m.to_dict() for m in msgs], True, tools=TOOLS)
        assert ours.token_ids == tuple(rt.encode(whole)), name
        assert "get_weather" in rt.decode(ours.prefix_ids)        # the catalogue is in the shared prefix
        assert [p.label for p in ours.parts] == ["prefix"] + [m.label for m in msgs if m.role != "system"] + ["prompt"]
        skip = 1 if msgs[0].role == "system" else 0
        for k in range(skip + 1, len(msgs)):   # the parts of messages[:k] begin the rendering of messages[:k] alone
            head = render(rt, msgs[:k], tools=TOOLS, generation_prompt=False).token_ids
            cut = sum(len(p.token_ids) for p in ours.parts[:k - skip + 1])
            assert ours.token_ids[:cut] == head[:cut], (name, k)
            followed_by_tool = msgs[k - 1].role == "tool" and msgs[k].role == "tool"
            assert len(head) - cut == (3 if followed_by_tool else 0), (name, k)   # '>', '<|im_end|>', '\n'


@pytest.mark.zoo
@pytest.mark.parametrize("model", ["SmolLM2-135M-Instruct", "Gemma-3-270M"])
def test_a_model_whose_template_cannot_render_tools_is_refused_naming_it_and_tools(model):
    from c2c.runtime import zoo
    from c2c.conversation.render import Message, render

    rt = zoo.load(model)
    with pytest.raises(ToolCallError) as e:
        render(rt, [Message(role="user", content="hi")], tools=TOOLS)
    assert e.value.param == "tools" and model in str(e.value)


# ------------------------------------------------------------- the server on its default model
def qwen(server, **kw):
    return server.client("analyst").chat.completions.create(model="Qwen2.5-Coder-0.5B-Instruct", temperature=0,
                                                             max_tokens=kw.pop("max_tokens", 60), **kw)


def ask(server, *, agent="analyst", **kw):
    return server.client(agent).chat.completions.create(
        model="Qwen2.5-Coder-0.5B-Instruct", messages=kw.pop("messages", [SYSTEM, {"role": "user", "content": "Weather in Oslo?"}]),
        tools=kw.pop("tools", TOOLS), max_tokens=kw.pop("max_tokens", 48), **kw)


def valid_calls(message) -> list[tuple[str, dict]]:
    out = []
    for c in message.tool_calls or ():
        assert c.type == "function" and c.id.startswith("call_")
        args = json.loads(c.function.arguments)
        jsonschema.validate(args, SCHEMAS[c.function.name])
        out.append((c.function.name, args))
    return out


@pytest.mark.zoo
def test_tool_choice_required_and_a_named_function_are_guaranteed_calls_that_validate(qwen_server):
    """Asked for a joke, the model calls no tool in auto: that every reply is a call is the constraint's doing."""
    joke = [SYSTEM, {"role": "user", "content": "Tell me a joke about cats."}]
    assert not ask(qwen_server, messages=joke, temperature=0).choices[0].message.tool_calls
    for seed in range(1):
        r = ask(qwen_server, messages=joke, tool_choice="required", temperature=1.0, seed=seed, max_tokens=160)
        assert r.choices[0].finish_reason == "tool_calls" and valid_calls(r.choices[0].message), r
        assert r.choices[0].message.content is None
        r = ask(qwen_server, messages=joke, tool_choice={"type": "function", "function": {"name": "add"}},
                temperature=1.0, seed=seed, max_tokens=160)
        assert [n for n, _ in valid_calls(r.choices[0].message)] == ["add"]


@pytest.mark.zoo
def test_streamed_tool_calls_arrive_as_indexed_deltas_with_the_non_streamed_calls(qwen_server):
    kw = dict(tool_choice="required", temperature=0)
    whole = valid_calls(ask(qwen_server, **kw).choices[0].message)
    chunks = [c for c in ask(qwen_server, stream=True, **kw) if c.choices]
    deltas = [t for c in chunks for t in c.choices[0].delta.tool_calls or ()]
    assert [d.index for d in deltas] == list(range(len(whole)))
    assert [(d.function.name, json.loads(d.function.arguments)) for d in deltas] == whole
    assert all(d.id.startswith("call_") and d.type == "function" for d in deltas)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not "".join(c.choices[0].delta.content or "" for c in chunks)   # nothing of the call leaks as content


@pytest.mark.zoo
def test_tools_with_a_response_format_give_a_call_or_the_formats_json_never_neither(qwen_server):
    """The case vLLM drops (tools and response_format with tool_choice auto, as the Agents SDK sends them)."""
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
              "additionalProperties": False}
    for seed in range(2):
        r = ask(qwen_server, temperature=1.0, seed=seed, max_tokens=64,
                response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}})
        m = r.choices[0].message
        if r.choices[0].finish_reason == "length":
            continue   # cut short: neither can be whole
        if m.tool_calls:
            assert valid_calls(m) and r.choices[0].finish_reason == "tool_calls"
        else:
            jsonschema.validate(json.loads(m.content), schema)


@pytest.mark.zoo
def test_tool_choice_none_and_no_tools_give_plain_content(qwen_server):
    r = ask(qwen_server, tool_choice="none", temperature=0, max_tokens=8)
    assert r.choices[0].message.tool_calls is None and isinstance(r.choices[0].message.content, str)


@pytest.mark.parametrize("extra, param, code", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": 5}}}]},
     "tools.0.function.parameters", "invalid_schema"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name",
     "invalid_request"),
    ({"messages": [SYSTEM, {"role": "user", "content": "a"}, {"role": "tool", "tool_call_id": "zz", "content": "x"}]},
     "messages.2.tool_call_id", "invalid_request"),
    ({"messages": [SYSTEM, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "add", "arguments": "{not json"}}]}]},
     "messages.1.tool_calls.0.function.arguments", "invalid_request"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]},
     "tools", "invalid_request"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "invalid_request"),
])
@pytest.mark.zoo
def test_bad_tool_input_is_a_400_naming_the_field_and_the_session_is_unchanged(qwen_server, extra, param, code):
    import openai

    session = f"tools-bad-{abs(hash(param)) % 10**6}"
    first = [SYSTEM, {"role": "user", "content": "Weather in Oslo?"}]
    r1 = ask(qwen_server, messages=first, temperature=0, max_tokens=4, extra_body={"c2c": {"session": session}})
    with pytest.raises(openai.BadRequestError) as e:
        ask(qwen_server, **{"messages": first, "temperature": 0, "max_tokens": 4,
                            "extra_body": {"c2c": {"session": session}}, **extra})
    err = e.value.body
    assert (err["param"], err["code"]) == (param, code), err
    again = ask(qwen_server, messages=first, temperature=0, max_tokens=4, extra_body={"c2c": {"session": session}})
    assert c2c_field(again)["session"]["turns"] == 2     # the refused request left no turn behind
    assert again.choices[0].message == r1.choices[0].message
    assert again.usage.prompt_tokens_details.cached_tokens == r1.usage.prompt_tokens - 1   # all but the last token


@pytest.mark.zoo
def test_a_tool_result_is_labelled_by_its_tool_and_published_as_its_own_slice(qwen_server):
    """Minimization on real tool messages: the slice of the tool result (labelled by the called tool's name) and
    the reply, without the user's turn."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    msgs = [SYSTEM, {"role": "user", "content": "private question: weather in Oslo?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Oslo: 4 C, snow"}]
    r = ask(qwen_server, messages=msgs, tool_choice="none", temperature=0, max_tokens=4,
            extra_body={"c2c": {"session": "tools-pub", "publish": {"labels": ["get_weather", "assistant"]}}})
    pub = c2c_field(r)["publish"]
    assert pub["kind"] == "slice" and pub["labels"] == ["get_weather", "assistant"]
    cold = ask(qwen_server, messages=msgs, tool_choice="none", temperature=0, max_tokens=4)
    assert pub["tokens"] < cold.usage.prompt_tokens      # the slice leaves the user's turn out


@pytest.mark.zoo
def test_a_tool_result_answers_to_its_call_id_so_one_result_of_a_tool_called_twice_is_a_slice(qwen_server):
    calls = [{"id": f"call_{k}", "type": "function",
              "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}
             for k, city in ((1, "Oslo"), (2, "Bergen"))]
    msgs = [SYSTEM, {"role": "user", "content": "private question: weather in Oslo and Bergen?"},
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": "call_1", "content": "Oslo: 4 C, snow"},
            {"role": "tool", "tool_call_id": "call_2", "content": "Bergen: 7 C, rain all day long, wind from the west"}]

    def publish(labels, session):
        return ask(qwen_server, messages=msgs, tool_choice="none", temperature=0, max_tokens=4,
                   extra_body={"c2c": {"session": session, "publish": {"labels": labels}}})

    import openai

    one = c2c_field(publish(["call_2"], "by-id"))["publish"]
    both = c2c_field(publish(["get_weather"], "by-name"))["publish"]
    assert one["kind"] == both["kind"] == "slice" and one["labels"] == ["call_2"]
    assert 0 < one["tokens"] < both["tokens"]        # Bergen's result, without Oslo's
    with pytest.raises(openai.BadRequestError) as e:
        publish(["call_9"], "by-bad-id")
    assert "call_9" in e.value.body["message"] and "call_2" in e.value.body["message"]


# ------------------------------------------------------------- real clients
@pytest.mark.zoo
def test_the_default_model_calls_a_tool_in_auto_and_its_result_continues_the_session(qwen_server):
    """Qwen2.5-Coder writes its call as fenced JSON, not in the <tool_call> tags its template asks for: vLLM's
    hermes parser returns it as content (#55); here it is a call."""
    q = [{"role": "user", "content": "What's the weather in Paris?"}]
    r = qwen(qwen_server, messages=q, tools=TOOLS, extra_body={"c2c": {"session": "qt"}})
    assert r.choices[0].finish_reason == "tool_calls"
    assert valid_calls(r.choices[0].message) == [("get_weather", {"city": "Paris"})]
    call = r.choices[0].message.tool_calls[0]
    q2 = q + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
              {"role": "tool", "tool_call_id": call.id, "content": "It is sunny and 21 C in Paris."}]
    r2 = qwen(qwen_server, messages=q2, tools=TOOLS, max_tokens=8, extra_body={"c2c": {"session": "qt"}})
    cold = qwen(qwen_server, messages=q2, tools=TOOLS, max_tokens=8)
    assert r2.usage.prompt_tokens == cold.usage.prompt_tokens
    assert r2.usage.prompt_tokens_details.cached_tokens > 100   # the catalogue and the question, from the session
    assert r2.choices[0].message.content == cold.choices[0].message.content
    streamed = [c for c in qwen(qwen_server, messages=q, tools=TOOLS, stream=True) if c.choices]
    deltas = [t for c in streamed for t in c.choices[0].delta.tool_calls or ()]
    assert [(d.function.name, json.loads(d.function.arguments)) for d in deltas] == [("get_weather", {"city": "Paris"})]
    assert streamed[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.zoo
def test_a_langgraph_agent_with_two_tools_runs_its_loop_on_the_default_model(qwen_server):
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    ran = []

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        ran.append(("get_weather", city))
        return f"It is sunny and 21 C in {city}."

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        ran.append(("add", a, b))
        return a + b

    llm = ChatOpenAI(model="Qwen2.5-Coder-0.5B-Instruct", base_url=qwen_server.base_url, temperature=0,
                     api_key="tok-analyst-0123456789abcdef", max_tokens=60, max_retries=0)
    out = create_react_agent(llm, [get_weather, add]).invoke(
        {"messages": [("user", "What is 17 plus 25?")]}, {"recursion_limit": 8})
    msgs = out["messages"]
    assert ran[0] == ("add", 17, 25)                         # the model's call, parsed, ran the tool
    assert any(isinstance(m, ToolMessage) and m.content == "42" for m in msgs)
    assert isinstance(msgs[-1], AIMessage) and not msgs[-1].tool_calls   # the loop ended on a reply, not a call


@pytest.mark.zoo
def test_langchain_structured_output_by_function_calling_and_by_json_schema(qwen_server):
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel

    class City(BaseModel):
        name: str
        country: str

    llm = ChatOpenAI(model="Qwen2.5-Coder-0.5B-Instruct", base_url=qwen_server.base_url, temperature=0,
                     api_key="tok-analyst-0123456789abcdef", max_tokens=60, max_retries=0)
    for method in ("function_calling", "json_schema"):
        got = llm.with_structured_output(City, method=method).invoke("Paris is the capital of which country?")
        assert isinstance(got, City) and got.name and got.country, method


@pytest.mark.zoo
def test_the_agents_sdk_sends_a_function_tool_with_an_output_type_and_gets_the_call(qwen_server):
    """The Agents SDK sends tools and response_format together for an agent with an output_type, the request vLLM
    answers without its calls (#39929): here the reply is the call, and the SDK runs the tool."""
    import asyncio

    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI
    from pydantic import BaseModel

    set_tracing_disabled(True)
    ran = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        ran.append(city)
        return f"It is sunny and 21 C in {city}."

    class Report(BaseModel):
        city: str
        weather: str

    client = AsyncOpenAI(base_url=qwen_server.base_url, api_key="tok-analyst-0123456789abcdef", max_retries=0)
    model = OpenAIChatCompletionsModel(model="Qwen2.5-Coder-0.5B-Instruct", openai_client=client)
    settings = ModelSettings(temperature=0, max_tokens=80)
    agent = Agent(name="weather", instructions="Call get_weather for the city asked about.", tools=[get_weather],
                  output_type=Report, model=model, model_settings=settings, tool_use_behavior="stop_on_first_tool")
    typed = Agent(name="report", instructions="Report the weather as given.", output_type=Report, model=model,
                  model_settings=settings)

    async def both():   # one event loop for the one client
        return (await Runner.run(agent, "What's the weather in Paris?", max_turns=2),
                await Runner.run(typed, "Paris: sunny, 21 C.", max_turns=1))

    result, report = asyncio.run(both())
    assert ran == ["Paris"] and result.final_output == "It is sunny and 21 C in Paris."
    assert isinstance(report.final_output, Report) and report.final_output.city


# ------------------------------------------------------------- tool-using agents hand caches to each other
@pytest.mark.zoo
def test_a_tool_using_analyst_hands_its_cache_to_a_writer_with_the_same_catalogue(qwen_server):
    """The analyst calls a tool, reads its result and answers, publishing its session; the writer continues that
    conversation (the continuation shape) with the same tools: the commit's K/V lie on its messages, nothing of
    them is prefilled, and the answer is the one of reading them all. A writer with another catalogue has another
    shared prefix (the catalogue is in the system turn): in auto it reads the commit as text, and the reason says
    so; in full it is refused."""
    call = {"id": "call_w1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    convo = [SYSTEM, {"role": "user", "content": "Weather in Oslo?"},
             {"role": "assistant", "content": None, "tool_calls": [call]},
             {"role": "tool", "tool_call_id": "call_w1", "content": "Oslo: 4 C, snow, wind from the north."}]
    r1 = ask(qwen_server, messages=convo, tool_choice="none", temperature=0, max_tokens=12,
             extra_body={"c2c": {"session": "tools-analyst", "publish": {"stream": "tools-analyst"}}})
    pub = c2c_field(r1)["publish"]
    assert pub["kind"] == "full"
    handed = convo + [{"role": "assistant", "content": r1.choices[0].message.content},
                      {"role": "user", "content": "Write one line for the newsletter."}]
    kw = dict(messages=handed, agent="writer", tool_choice="none", temperature=0, max_tokens=8)
    cold = ask(qwen_server, **kw)
    r2 = ask(qwen_server, **kw, extra_body={"c2c": {"attach": [pub["commit"]], "mode": "full"}})
    [rec] = c2c_field(r2)["attach"]
    assert rec["path"] == "cache" and rec["used"] == "full" and rec["prefilled_tokens"] == 0
    assert rec["imported_tokens"] == pub["tokens"]
    assert r2.usage.prompt_tokens == cold.usage.prompt_tokens
    assert r2.choices[0].message.content == cold.choices[0].message.content
    other = [TOOLS[1]]   # the writer's catalogue lacks get_weather
    r3 = ask(qwen_server, **{**kw, "tools": other}, extra_body={"c2c": {"attach": [pub["commit"]], "mode": "auto"}})
    [rec3] = c2c_field(r3)["attach"]
    assert rec3["used"] == "text" and "tool catalogue" in rec3["reason"]
    import openai
    with pytest.raises(openai.ConflictError) as e:
        ask(qwen_server, **{**kw, "tools": other}, extra_body={"c2c": {"attach": [pub["commit"]], "mode": "full"}})
    assert e.value.body["c2c_error"] == "PrefixMismatchError"
