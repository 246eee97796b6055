"""``report.html`` and ``report.md``: the view model (``view.py``) rendered by two Jinja2 templates.

``templates/report.html.j2`` is one self-contained page (inline CSS and SVG, no
scripts, no fetches), every text autoescaped; the timelines' SVG is the one
piece of markup it inserts as it is (``view_charts.py`` marks it). Its
whitespace is for the reader of the template: newlines and the indentation
after them are dropped as the template is read (``Compact``), so the page keeps
the spacing of the markup alone. ``templates/report.md.j2`` is GitHub Markdown
for a terminal or a pull request, in the same order without pictures. Text
from the audit passes its ``md`` filter, so it reads as written, comparisons
included (``912 < 346``): only what Markdown would take for markup is
escaped, a ``<`` that would open a tag, an ``&`` that would name an entity,
``|`` and newlines. ``code`` and ``fence`` quote a text with enough backticks.

Example::

    view = page(audit, summary, log, incidents)
    Path("report.html").write_text(render_html(view))
    Path("report.md").write_text(render_markdown(view))

``templates/fleet.html.j2`` and ``fleet.md.j2`` are the report across nodes
(``fleet.py``), on the same stylesheet (``_style.html.j2``).

Overhead: linear in what the view holds; the templates are compiled once per process.
"""
from __future__ import annotations

import html
import re
from functools import lru_cache

import jinja2
from jinja2.ext import Extension
from jinja2.lexer import Token
from markupsafe import Markup

from .timeline_svg import STATE_COLOURS
from .view import Page

_ENTITY = re.compile(r"&(?=#?[A-Za-z0-9]+;)")     # &amp; &#60; ... would render as a character
_TAG = re.compile(r"<(?=[A-Za-z/!?])")              # <script> <!-- ... would render as HTML
_NEWLINE_INDENT = re.compile(r"\n\s*")
CHIP_DEFAULT = "#fff"


class Compact(Extension):
    """Drops a template's newlines and the indentation after them (its own text only, not what it inserts)."""

    def filter_stream(self, stream):
        for token in stream:
            if token.type == "data":
                token = Token(token.lineno, "data", _NEWLINE_INDENT.sub("", token.value))
            yield token


def html_text(value) -> Markup:
    """Every ``{{ }}`` of the HTML template: escaped as ``html.escape`` does (``&quot;``, ``&#x27;``), the form
    the page has always had and readers search for; markup (a macro's, the SVG) is left as it is."""
    if isinstance(value, Markup):
        return value
    return Markup(html.escape("" if value is None else str(value), quote=True))


def md(value) -> str:
    """Text for a Markdown line or table cell: what would be markup is escaped, the rest reads as written."""
    text = "" if value is None else str(value)
    text = _TAG.sub("&lt;", _ENTITY.sub("&amp;", text))
    return text.replace("|", "\\|").replace("\r", "").replace("\n", "<br>")


def code(value) -> str:
    """An inline code span that holds any text: as many backticks as it needs."""
    text = "" if value is None else str(value).replace("\n", " ")
    ticks = "`"
    while ticks in text:
        ticks += "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def fence(text: str, lang: str = "", indent: str = "") -> str:
    """A fenced code block of ``text``, each line indented by ``indent``."""
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return "\n".join(indent + line for line in [ticks + lang, *text.splitlines(), ticks])


@lru_cache(maxsize=None)
def environment(kind: str) -> jinja2.Environment:
    loader = jinja2.PackageLoader("reflexarc.controller.report", "templates")
    if kind == "html":
        env = jinja2.Environment(loader=loader, autoescape=True, undefined=jinja2.StrictUndefined,
                                 extensions=[Compact], finalize=html_text)
        env.globals["STATE_COLOURS"] = STATE_COLOURS
        env.globals["CHIP_DEFAULT"] = CHIP_DEFAULT
        return env
    env = jinja2.Environment(loader=loader, autoescape=False, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters.update(md=md, code=code, fence=fence)
    return env


def render_html(view: Page) -> str:
    return environment("html").get_template("report.html.j2").render(page=view)


def render_markdown(view: Page) -> str:
    return environment("md").get_template("report.md.j2").render(page=view)


def render_fleet(view: dict, kind: str) -> str:
    """The report across nodes (``fleet.py``'s view) as ``html`` or ``md``."""
    return environment(kind).get_template(f"fleet.{kind}.j2").render(page=view)
