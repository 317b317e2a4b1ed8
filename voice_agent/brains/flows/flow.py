"""The deterministic flow brain: Dialogflow-style pages, forms and routes over matched intents."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import re
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from voice_agent.brains.flows.intents import FILLERS, IntentMatch, IntentSpec, Matcher, MatchResult
from voice_agent.brains.flows.parameters import (
    EntitySpec,
    ParameterSpec,
    extract_parameters,
    parse_yes_no,
)
from voice_agent.config import FlowConfig, HandlerConfig, RouteConfig
from voice_agent.errors import ConfigError, ExpressionError, ToolError
from voice_agent.runtime.call_control import CallTransfer, SendDigits, check_digits
from voice_agent.runtime.conversation import ToolCallRecord
from voice_agent.runtime.expressions import Expression, parse_expression
from voice_agent.runtime.templates import render
from voice_agent.runtime.turn_events import ActionResult, AgentEvent, CallEnd, StepOutcome
from voice_agent.runtime.update_state import compile_updates, evaluate_updates

if TYPE_CHECKING:
    from voice_agent.runtime.agent import CompiledAgent
    from voice_agent.runtime.session import CallSession

_PARAM_TYPES = {
    "number",
    "integer",
    "digits",
    "phone",
    "date",
    "time",
    "datetime",
    "yes_no",
    "name",
    "text",
}


def parameter_spec(
    name: str, declared: Any, entities: Mapping[str, EntitySpec], where: str, file: str
) -> ParameterSpec:
    """`number`, `datetime`, ... or `"@entity"` for one of the declared enum entities."""
    if isinstance(declared, Mapping):
        declared = declared.get("type")
    if not isinstance(declared, str):
        raise ConfigError("a parameter type must be a string", file=file, key=where)
    if declared.startswith("@"):
        entity = declared[1:]
        if entity not in entities:
            raise ConfigError(f"unknown entity {entity!r}", file=file, key=where)
        return ParameterSpec(name, "enum", entity)
    if declared not in _PARAM_TYPES:
        raise ConfigError(
            f"unknown parameter type {declared!r}; use one of {sorted(_PARAM_TYPES)} or @entity",
            file=file,
            key=where,
        )
    return ParameterSpec(name, declared)  # type: ignore[arg-type]


def load_intents(data: Any, path: Path) -> tuple[list[IntentSpec], dict[str, EntitySpec]]:
    file = str(path)
    if not isinstance(data, Mapping) or not isinstance(data.get("intents"), Mapping):
        raise ConfigError("an intents file needs an 'intents' mapping", file=file)
    for top in data:
        if top not in ("intents", "entities"):
            raise ConfigError(
                "unknown key (expected 'intents' and 'entities')", file=file, key=str(top)
            )
    entities: dict[str, EntitySpec] = {}
    for name, values in (data.get("entities") or {}).items():
        if not isinstance(values, Mapping):
            raise ConfigError(
                "an entity maps values to synonym lists", file=file, key=f"entities.{name}"
            )
        for value, synonyms in values.items():
            if synonyms is not None and not isinstance(synonyms, list):
                raise ConfigError(
                    "synonyms must be a list, e.g. [inside, indoors]",
                    file=file,
                    key=f"entities.{name}.{value}",
                )
        entities[name] = EntitySpec(
            name,
            {
                str(value): tuple(str(s) for s in (synonyms or ()))
                for value, synonyms in values.items()
            },
        )
    intents: list[IntentSpec] = []
    for name, body in data["intents"].items():
        where = f"intents.{name}"
        if not isinstance(body, Mapping) or not body.get("phrases"):
            raise ConfigError("an intent needs a list of 'phrases'", file=file, key=where)
        unknown = set(body) - {"phrases", "parameters"}
        if unknown:
            raise ConfigError(f"unknown key(s) {sorted(unknown)}", file=file, key=where)
        parameters = tuple(
            parameter_spec(p, t, entities, f"{where}.parameters.{p}", file)
            for p, t in (body.get("parameters") or {}).items()
        )
        intents.append(IntentSpec(name, tuple(str(p) for p in body["phrases"]), parameters))
    return intents, entities


_RESERVED_EVENTS = {
    "no-input": "use the flow's no_input",
    "no-match": "use the flow's no_match",
    "error": "use the flow's on_error",
    "welcome": "the start page's message greets the caller; use @EventTrigger('welcome') for code",
    "call-ended": "nothing can be said after the call; use @EventTrigger('call-ended')",
}


@dataclass(frozen=True)
class Route:
    intent: str | None
    condition: Expression | None
    set: dict[str, Expression]
    call: str | None
    say: str | None
    goto: str | None
    transfer: str | None
    end_call: bool
    on_error: Route | None = None
    send_dtmf: str | None = None  # checked keypad keys
    transfer_call: str | None = None  # one of the agent's destinations


@dataclass(frozen=True)
class FormField:
    spec: ParameterSpec
    prompt: str
    required: bool


@dataclass(frozen=True)
class Page:
    name: str
    message: str | None
    form: tuple[FormField, ...]
    routes: tuple[Route, ...]


class FlowBrain:
    def __init__(
        self,
        agent: CompiledAgent,
        matcher: Matcher,
        pages: dict[str, Page],
        start_page: str,
        routes: tuple[Route, ...],
        handlers: dict[str, Route],
        page_intent_margin: float = 0.05,
    ) -> None:
        self.agent_name = agent.name
        self.pages = pages
        self.start_page = start_page
        self.routes = routes
        self.handlers = handlers
        self.page_intent_margin = page_intent_margin
        self.matcher = matcher
        self.entities = matcher.entities
        # The parameters that hold a day or a time said on its own ("date", "time" of the
        # default agent's intents): a datetime said in halves, in a form or an intent's
        # parameters, is joined from them.
        intents = matcher.intents
        self.intent_parameters = {intent.name: intent.parameters for intent in intents}
        specs = [spec for intent in intents for spec in intent.parameters]
        specs += [field_.spec for page in pages.values() for field_ in page.form]
        self.date_names = tuple(dict.fromkeys(s.name for s in specs if s.type == "date"))
        self.time_names = tuple(dict.fromkeys(s.name for s in specs if s.type == "time"))

    # ---- compiling ---------------------------------------------------------------------

    @classmethod
    def compile(
        cls, agent: CompiledAgent, matcher: Matcher, flow: FlowConfig, *, file: str, key: str
    ) -> FlowBrain:
        intent_names = {intent.name for intent in matcher.intents}
        entities = matcher.entities
        functions = agent.local_tools
        targets = set(agent.config.transitions)
        destinations = agent.config.destinations

        def route(config: RouteConfig | HandlerConfig, where: str) -> Route:
            intent = getattr(config, "intent", None)
            if intent is not None and intent not in intent_names:
                raise ConfigError(f"unknown intent {intent!r}", file=file, key=f"{where}.intent")
            condition = None
            source = getattr(config, "condition", None)
            if source:
                try:
                    condition = parse_expression(source, "condition")
                except ExpressionError as exc:
                    raise ConfigError(str(exc), file=file, key=f"{where}.condition") from None
            if config.call is not None and config.call not in functions:
                raise ConfigError(
                    f"function {config.call!r} is not in the agent's functions module",
                    file=file,
                    key=f"{where}.call",
                )
            if config.goto is not None and config.goto not in flow.pages:
                raise ConfigError(f"unknown page {config.goto!r}", file=file, key=f"{where}.goto")
            if config.transfer is not None and config.transfer not in targets:
                raise ConfigError(
                    f"{config.transfer!r} is not in this agent's transitions",
                    file=file,
                    key=f"{where}.transfer",
                )
            if config.transfer_call is not None and config.transfer_call not in destinations:
                raise ConfigError(
                    f"{config.transfer_call!r} is not one of this agent's destinations"
                    f" {sorted(destinations)}",
                    file=file,
                    key=f"{where}.transfer_call",
                )
            digits = None
            if config.send_dtmf is not None:
                try:
                    digits = check_digits(config.send_dtmf)
                except ToolError as exc:
                    raise ConfigError(exc.message, file=file, key=f"{where}.send_dtmf") from None
            updates = compile_updates(config.set, file=file, key=f"{where}.set", allow_llm=False)
            on_error = getattr(config, "on_error", None)
            return Route(
                intent,
                condition,
                updates,
                config.call,
                config.say,
                config.goto,
                config.transfer,
                config.end_call,
                route(on_error, f"{where}.on_error") if on_error is not None else None,
                digits,
                config.transfer_call,
            )

        pages: dict[str, Page] = {}
        for name, page in flow.pages.items():
            where = f"{key}.pages.{name}"
            form = tuple(
                FormField(
                    parameter_spec(p, f.type, entities, f"{where}.form.{p}", file),
                    f.prompt,
                    f.required,
                )
                for p, f in page.form.items()
            )
            routes = tuple(route(r, f"{where}.routes[{i}]") for i, r in enumerate(page.routes))
            pages[name] = Page(name, page.message, form, routes)
        flow_routes = tuple(route(r, f"{key}.routes[{i}]") for i, r in enumerate(flow.routes))
        handlers = {
            "no-match": route(flow.no_match, f"{key}.no_match"),
            "no-input": route(flow.no_input, f"{key}.no_input"),
            "error": route(flow.on_error, f"{key}.on_error"),
        }
        for name, handler in flow.events.items():
            if name in _RESERVED_EVENTS:
                raise ConfigError(
                    f"{name!r} is not an event handler here: {_RESERVED_EVENTS[name]}",
                    file=file,
                    key=f"{key}.events.{name}",
                )
            handlers[name] = route(handler, f"{key}.events.{name}")
        return cls(
            agent, matcher, pages, flow.start_page, flow_routes, handlers, flow.page_intent_margin
        )

    # ---- running -----------------------------------------------------------------------

    def _page(self, session: CallSession) -> Page:
        return self.pages[session.flow_page.get(self.agent_name, self.start_page)]

    def _missing(self, page: Page, state: Mapping[str, Any]) -> list[FormField]:
        return [f for f in page.form if f.required and state.get(f.spec.name) is None]

    def expecting(self, session: CallSession) -> str | None:
        """The type of the form field the page prompts for next, or "yes_no" on a page whose
        routes wait for a yes or a no."""
        page = self._page(session)
        missing = self._missing(page, session.state)
        if missing:
            return str(missing[0].spec.type)
        intents = {route.intent for route in page.routes}
        return "yes_no" if {"confirm", "deny"} & intents else None

    async def enter(self, session: CallSession, outcome: StepOutcome) -> AsyncIterator[AgentEvent]:
        async for item in self._go(session, self.start_page, outcome):
            yield item

    async def _go(
        self, session: CallSession, page_name: str, outcome: StepOutcome
    ) -> AsyncIterator[AgentEvent]:
        session.flow_page[self.agent_name] = page_name
        page = self.pages[page_name]
        session.audit.add("page", agent=self.agent_name, page=page_name)
        if page.message:
            async for item in session.say(render(page.message, session.state)):
                yield item
        missing = self._missing(page, session.state)
        if missing:
            async for item in session.say(render(missing[0].prompt, session.state)):
                yield item
        elif page.form:
            # Everything was known already: the page's FINAL routes may fire at once.
            async for item in self._route(session, None, outcome, form_final=True):
                yield item

    async def turn(self, session: CallSession, text: str) -> AsyncIterator[AgentEvent]:
        outcome = StepOutcome()
        page = self._page(session)
        now = session.now()
        # Matching by meaning encodes the utterance (about 11 ms of CPU): not on the event loop.
        result = await asyncio.to_thread(self.matcher.match, text, now=now)
        earlier_date = _earlier(session.state, self.date_names, date.fromisoformat)
        earlier_time = _earlier(session.state, self.time_names, time.fromisoformat)
        best = self._answering(page, result)
        if best is not None and (earlier_date or earlier_time):
            best = self._with_earlier(best, text, now, earlier_date, earlier_time)
        session.audit.add(
            "intent_match",
            text=text,
            intent=best.intent if best else None,
            confidence=round(best.confidence, 3) if best else None,
            parameters=best.parameters if best else {},
        )
        filled: dict[str, Any] = {}
        unset = [f for f in page.form if session.state.get(f.spec.name) is None]
        if unset:
            specs = [f.spec for f in unset]
            # The caller is answering the prompt the agent last said: the first one missing.
            asked = self._missing(page, session.state)
            prompted = asked[0].spec.name if asked else None
            filled = extract_parameters(
                text,
                specs,
                now=now,
                entities=self.entities,
                prompted=prompted,
                earlier_date=earlier_date,
                earlier_time=earlier_time,
            )
            if best is not None:
                for field_ in unset:
                    if field_.spec.name in best.parameters and field_.spec.name not in filled:
                        filled[field_.spec.name] = best.parameters[field_.spec.name]
            if filled:
                session.set_state(filled, source=f"{self.agent_name}.form")
        fired = False
        async for item in self._route(session, best, outcome, form_final=False):
            fired = True
            yield item
        if fired or outcome.call_ended or outcome.transferred:
            return
        missing = self._missing(page, session.state)
        if not filled:
            async for item in self._handle(session, "no-match", outcome):
                yield item
        if missing and self._page(session) is page:
            async for item in session.say(render(missing[0].prompt, session.state)):
                yield item

    def _with_earlier(
        self,
        best: IntentMatch,
        text: str,
        now: datetime,
        earlier_date: date | None,
        earlier_time: time | None,
    ) -> IntentMatch:
        """`best` with its datetimes completed by the day or time the caller gave before
        ("are you open on sunday", then "a table for two at eight": Sunday at 8 pm); the
        matcher extracted them from this utterance alone."""
        specs = self.intent_parameters.get(best.intent, ())
        if not any(spec.type == "datetime" for spec in specs):
            return best
        parameters = extract_parameters(
            text,
            specs,
            now=now,
            entities=self.entities,
            earlier_date=earlier_date,
            earlier_time=earlier_time,
        )
        return dataclasses.replace(best, parameters=parameters)

    def _answering(self, page: Page, result: MatchResult) -> IntentMatch | None:
        """The intent the turn goes by: the best match, unless one the page's own routes
        expect also matched and the caller is answering the page's question with it.

        That is so on a near tie, within `page_intent_margin` ("yes all correct" to "Shall I
        book it?" scores goodbye 0.69, confirm 0.68), and when the best would end the call
        but the page's match holds the caller's yes or no ("yes that's everything": goodbye
        0.93, confirm 0.79 with its yes): a caller who answered the question is not hung up
        on. A yes alone does not outweigh another question ("yeah what time do you close"
        stays one about opening hours). An answer said first ("yes cancel it") widens the
        margin to twice its size."""
        best = result.best
        expected = {route.intent for route in page.routes if route.intent is not None}
        if best is None or best.intent in expected:
            return best
        ends_call = any(
            route.intent == best.intent and (route.end_call or route.transfer is not None)
            for route in self.routes
        )
        opens_with_answer = _opens_with_answer(result.text)
        for match in result.matches:
            if match.intent not in expected:
                continue
            answers = any(isinstance(value, bool) for value in match.parameters.values())
            # "yes cancel it" to "Shall I cancel it?": an answer said first, then the action
            # it agrees to, which matching by meaning reads as the action; twice the margin.
            margin = self.page_intent_margin * (2 if answers and opens_with_answer else 1)
            near = match.confidence >= best.confidence - margin
            if near or (ends_call and answers):
                return match
        return best

    def _refs(self, session: CallSession, best: IntentMatch | None, page: Page) -> dict[str, Any]:
        refs: dict[str, Any] = {
            "$page.name": page.name,
            "$page.params.status": "FINAL" if not self._missing(page, session.state) else None,
        }
        if best is not None:
            refs["$intent.name"] = best.intent
            refs["$intent.confidence"] = best.confidence
            for name, value in best.parameters.items():
                refs[f"$intent.params.{name}"] = value
        return refs

    async def _route(
        self,
        session: CallSession,
        best: IntentMatch | None,
        outcome: StepOutcome,
        *,
        form_final: bool,
    ) -> AsyncIterator[AgentEvent]:
        page = self._page(session)
        refs = self._refs(session, best, page)
        for route in page.routes + self.routes:
            if route.intent is not None and (best is None or best.intent != route.intent):
                continue
            if form_final and route.intent is not None:
                continue
            if route.condition is not None:
                try:
                    holds = route.condition.evaluate(session.state, refs=refs, now=session.now())
                except ExpressionError as exc:
                    session.audit.add("error", where=f"flow {page.name}", message=str(exc))
                    continue
                if not holds:
                    continue
            session.audit.add(
                "route",
                agent=self.agent_name,
                page=page.name,
                intent=route.intent,
                goto=route.goto,
                transfer=route.transfer,
            )
            if best is not None and route.intent is not None and best.parameters:
                session.set_state(best.parameters, source=f"intent {best.intent}")
            async for item in self._fire(session, route, outcome):
                yield item
            return

    async def _handle(
        self, session: CallSession, name: str, outcome: StepOutcome
    ) -> AsyncIterator[AgentEvent]:
        handler = self.handlers.get(name)
        if handler is not None:
            async for item in self._fire(session, handler, outcome):
                yield item

    async def event(
        self, session: CallSession, name: str, data: Mapping[str, Any], outcome: StepOutcome
    ) -> AsyncIterator[AgentEvent]:
        async for item in self._handle(session, name, outcome):
            yield item

    async def _fire(
        self,
        session: CallSession,
        route: Route,
        outcome: StepOutcome,
        variables: Mapping[str, Any] | None = None,
    ) -> AsyncIterator[AgentEvent]:
        if route.set:
            try:
                updates = evaluate_updates(route.set, session.state, now=session.now())
            except ToolError as exc:  # a type error, say, that only shows at run time
                session.audit.add("error", where=f"flow {self.agent_name}", message=exc.message)
                async for item in self._handle(session, "error", outcome):
                    yield item
                return
            session.set_state(updates, source=f"{self.agent_name}.route")
        values: dict[str, Any] = {**session.state, **(variables or {})}
        if route.call is not None:
            result: ActionResult | None = None
            async for step in self._call(session, route.call, outcome):
                if isinstance(step, ActionResult):
                    result = step
                else:
                    yield step
            if result is None or not result.ok:
                error = {"error": result.error if result else "interrupted"}
                if route.on_error is not None:
                    async for item in self._fire(session, route.on_error, outcome, error):
                        yield item
                    return
                async for item in self._handle(session, "error", outcome):
                    yield item
                return
            values = {**session.state, "result": result.value}
        if route.say:
            async for item in session.say(render(route.say, values)):
                yield item
        if route.send_dtmf is not None:
            yield SendDigits(route.send_dtmf)
        if route.transfer_call is not None:
            # The config checked the name; the caller leaves the flow once the line has played.
            target = session.agent.config.destinations[route.transfer_call]
            outcome.call_ended = True
            yield CallTransfer(route.transfer_call, target, reason=f"flow {self.agent_name}")
            return
        if route.transfer is not None:
            async for item in session.transfer(route.transfer, {}, outcome):
                yield item
            return
        if route.goto is not None:
            async for item in self._go(session, route.goto, outcome):
                yield item
        if route.end_call:
            outcome.call_ended = True
            yield CallEnd("agent ended the call")

    async def _call(
        self, session: CallSession, name: str, outcome: StepOutcome
    ) -> AsyncIterator[AgentEvent | ActionResult]:
        """A route's function, fed from state by parameter name; recorded like an LLM's call."""
        tool = session.agent.local_tools[name]
        parameters = inspect.signature(tool.fn).parameters
        arguments = {p: session.state[p] for p in parameters if session.state.get(p) is not None}
        call = ToolCallRecord(session.new_call_id("flow"), name, arguments)
        session.conversation.open_tool_calls([call])
        content: str | None = None
        try:
            async for item in session.run_action(call, outcome):
                if isinstance(item, ActionResult):
                    content = item.content
                yield item
        finally:
            if content is not None:
                session.conversation.set_tool_result(call.call_id, content)


_T = TypeVar("_T")


def _earlier(
    state: Mapping[str, Any], names: tuple[str, ...], parse: Callable[[str], _T]
) -> _T | None:
    """The first of `names` the caller has given a value (ISO, as parameters store it)."""
    for name in names:
        value = state.get(name)
        if isinstance(value, str):
            try:
                return parse(value)
            except ValueError:
                continue  # a function set it to something else: not the caller's day or time
    return None


def _opens_with_answer(text: str) -> bool:
    """Whether the utterance's first word, hesitations aside, is a yes or a no."""
    words = [w for w in re.findall(r"[a-z']+", text.lower()) if w not in FILLERS]
    return bool(words) and parse_yes_no(words[0]) is not None
