"""Server-side prompt templates: `{param}` placeholders filled from request params.

Placeholders are plain identifiers (`serve_app.config.ingress.template_placeholders`
refuses anything else when the config loads).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from serve_app.config import TemplateConfig
from serve_app.config.ingress import template_placeholders

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


class PromptTemplate:
    """A validated template that renders request params into a prompt."""

    def __init__(self, name: str, config: TemplateConfig) -> None:
        self.name = name
        self._config = config
        self.params = frozenset(
            template_placeholders(name, config.prompt) | template_placeholders(name, config.system or "")
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
