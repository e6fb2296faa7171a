"""Server-side prompt templates: `{param}` placeholders filled from request params.

Placeholders are plain identifiers; attribute access, indexing, conversions and
format specs are refused when the config loads, so a param can never reach into
Python objects the way `str.format` would allow.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from serve_app.config import TemplateConfig

ParamValue = str | int | float | bool


class TemplateError(ValueError):
    """A request's template or params do not fit; `param` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class RenderedPrompt:
    prompt: str
    """The user message (chat) or the whole prompt (completions)."""
    system: str | None
    """The system message, for chat requests."""


def _placeholders(template_name: str, text: str) -> set[str]:
    names: set[str] = set()
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise ValueError(f"template {template_name!r}: {exc}") from None
    for _literal, field, format_spec, conversion in parsed:
        if field is None:
            continue
        if not field.isidentifier() or format_spec or conversion:
            raise ValueError(
                f"template {template_name!r}: placeholder {{{field}}} must be a plain "
                "name like {text}, without attributes, indexes or format specs"
            )
        names.add(field)
    return names


class PromptTemplate:
    """A validated template that renders request params into a prompt."""

    def __init__(self, name: str, config: TemplateConfig) -> None:
        self.name = name
        self._config = config
        self.params = frozenset(
            _placeholders(name, config.prompt) | _placeholders(name, config.system or "")
        )

    def render(self, params: Mapping[str, ParamValue]) -> RenderedPrompt:
        missing = sorted(self.params - params.keys())
        if missing:
            raise TemplateError(
                f"template {self.name!r} is missing params: {', '.join(missing)}", "params"
            )
        unexpected = sorted(params.keys() - self.params)
        if unexpected:
            raise TemplateError(
                f"template {self.name!r} takes no params named: {', '.join(unexpected)}",
                "params",
            )
        values = {key: str(value) for key, value in params.items()}
        system = self._config.system
        return RenderedPrompt(
            prompt=self._config.prompt.format_map(values),
            system=system.format_map(values) if system is not None else None,
        )


class TemplateRegistry:
    """The templates of one app, by name."""

    def __init__(self, configs: Mapping[str, TemplateConfig]) -> None:
        self._templates = {name: PromptTemplate(name, cfg) for name, cfg in configs.items()}

    def render(self, name: str, params: Mapping[str, ParamValue]) -> RenderedPrompt:
        template = self._templates.get(name)
        if template is None:
            known = ", ".join(sorted(self._templates)) or "none configured"
            raise TemplateError(f"unknown template {name!r} (known: {known})", "template")
        return template.render(params)
