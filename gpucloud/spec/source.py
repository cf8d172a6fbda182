"""YAML loading for the job file: the composed node tree becomes plain data plus a map from each
path to its lines, with duplicate keys, alias bombs and YAML syntax errors reported as SpecIssues."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpucloud.spec.errors import KeyLines, dotted_path
from gpucloud.spec.values import SpecError, SpecIssue

if TYPE_CHECKING:
    from yaml import Node


# ---------------------------------------------------------------------------------------------
# YAML: node tree -> (data, line map, duplicate-key issues)

_MAX_NODES_BUILT = 100_000  # guards against YAML alias bombs ("billion laughs")
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_NUMBER_TAGS = {"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}


def _keeps_raw_text(path: tuple[Any, ...]) -> bool:
    """Values read verbatim when YAML sees a number: `cuda: 11.10` must not become "11.1", nor an
    env value `LR: 0.10` become "0.1"."""
    return (len(path) == 2 and path[0] == "env") or (
        len(path) == 2 and path[0] == "stack" and path[1] in {"driver", "cuda", "cudnn", "framework_version"}
    )


_CONTROL_NAMES = {0: "NUL", 0x1B: "ESC", 0x7F: "DEL"}


def _bad_character(text: str) -> str | None:
    """Why a YAML string cannot go into a job (a control character other than tab/newline, which
    YAML's escapes "\\0", "\\e", "\\x7f" let through; a lone surrogate "\\ud800", which no file
    or shell can carry), or None when it is fine."""
    for col, char in enumerate(text, 1):
        code = ord(char)
        if 0xD800 <= code <= 0xDFFF:
            return (
                f"contains a lone surrogate U+{code:04X} at character {col}, which is not a character. "
                "Remove it, or write the real character"
            )
        if (code < 0x20 and char not in "\t\n\r") or 0x7F <= code <= 0x9F:
            name = _CONTROL_NAMES.get(code, f"U+{code:04X}")
            return (
                f"contains the control character {name} at character {col}. Job files hold text: remove it "
                "(write a real tab or newline if one was meant)"
            )
    return None


class _Builder:
    """Builds plain Python data from a composed YAML tree while recording each path's lines."""

    def __init__(self, loader: Any, filename: str) -> None:
        self.loader = loader
        self.filename = filename
        self.lines: dict[tuple[Any, ...], KeyLines] = {}
        self.issues: list[SpecIssue] = []
        self.bad_paths: set[str] = set()  # already reported (bad YAML value): skip the model's errors there
        self.count = 0

    def build(self, node: Node, path: tuple[Any, ...], key_line: int) -> Any:
        import yaml

        self.count += 1
        if self.count > _MAX_NODES_BUILT:
            raise _TooBig()
        value_line = node.start_mark.line + 1
        self.lines[path] = KeyLines(key_line, value_line, isinstance(node, yaml.ScalarNode))
        if isinstance(node, yaml.MappingNode):
            if node.tag != _MAP_TAG:
                self._issue(value_line, path, f"the YAML tag '{node.tag}' is not supported. Remove it")
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            if node.tag != _SEQ_TAG:
                self._issue(value_line, path, f"the YAML tag '{node.tag}' is not supported. Remove it")
            return [self.build(item, (*path, i), item.start_mark.line + 1) for i, item in enumerate(node.value)]
        if isinstance(node, yaml.ScalarNode) and (bad := _bad_character(node.value)):
            self._issue(value_line, path, bad)
            self.bad_paths.add(dotted_path(path))
            return None
        if node.tag in _NUMBER_TAGS and (_keeps_raw_text(path) or ":" in node.value):
            # YAML 1.1 reads 1:30 as the base-60 number 90: nobody means that in a job file, so the
            # text goes to the validator, which says what it expected (e.g. 1h30m for a duration).
            return node.value
        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.MarkedYAMLError:
            raise
        except (ValueError, TypeError, AttributeError):  # e.g. `!!int abc`, `!!timestamp nonsense`
            tag = str(node.tag).rsplit(":", 1)[-1]
            self._issue(
                value_line,
                path,
                f"'{node.value}' is not a valid !!{tag} value. Remove the '!!{tag}' tag or fix the value",
            )
            self.bad_paths.add(dotted_path(path))
            return None

    def _mapping(self, node: Any, path: tuple[Any, ...]) -> dict[str, Any]:
        import yaml

        out: dict[str, Any] = {}
        first_line: dict[str, int] = {}
        merged: dict[str, Any] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == _MERGE_TAG:  # `<<: *defaults`: explicit keys win over merged ones
                sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                own = self.lines[path]
                for source in sources:
                    built = self.build(source, path, line)
                    if isinstance(built, dict):
                        merged = {**built, **merged}
                self.lines[path] = own  # building the anchor re-recorded this path at the anchor
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                self._issue(line, path, "a key must be a plain name, not a list or mapping")
                continue
            key = key_node.value  # keys are names: `1:` or `yes:` stay the text that was written
            if bad := _bad_character(key):
                self._issue(line, path, f"a key {bad[0].lower()}{bad[1:]}")
                continue
            if key in first_line:
                self._issue(
                    line,
                    (*path, key),
                    f"duplicate key '{key}' on lines {first_line[key]} and {line}. YAML would silently "
                    "keep only the last one; remove one of them",
                )
            first_line[key] = line
            out[key] = self.build(value_node, (*path, key), line)
        return {**merged, **out}

    def _issue(self, line: int, path: tuple[Any, ...], message: str) -> None:
        self.issues.append(SpecIssue(self.filename, line, dotted_path(path), message + "."))


class _TooBig(Exception):
    """The document expands to more nodes than any job file has (alias bomb)."""


def _line_text(text: str, line: int | None) -> str:
    lines = text.splitlines()
    return lines[line - 1] if line and 0 < line <= len(lines) else ""


def _yaml_error(filename: str, exc: Exception, text: str) -> SpecError:
    """A PyYAML error as one line with its line number."""
    import yaml

    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        what = exc.problem or "invalid YAML"
        context = ""
        if exc.context:
            at = f" on line {exc.context_mark.line + 1}" if exc.context_mark else ""
            context = f" ({exc.context}{at})"
        if "expected a single document" in f"{what} {exc.context or ''}":
            advice = "A job file holds one YAML document: remove the extra '---' part"
        elif "could not determine a constructor" in what:
            advice = "Job files use plain YAML: remove the '!' tag"
        elif "\t" in what or "\t" in _line_text(text, line):
            advice = "YAML does not allow tabs for indentation: use spaces"
        else:
            advice = "Check the indentation, the colons and the quoting around this line"
        return SpecError([SpecIssue(filename, line, "", f"invalid YAML: {what}{context}. {advice}.")])
    if isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        char = exc.character if isinstance(exc.character, str) else chr(exc.character)
        return SpecError(
            [
                SpecIssue(
                    filename,
                    line,
                    "",
                    (
                        f"invalid YAML: column {column} holds the character U+{ord(char):04X} ({char!r}), which YAML "
                        "does not allow in a file. Delete it (an editor or terminal escape sequence often leaves one); "
                        'inside a quoted string write it as an escape such as "\\e" instead'
                    ),
                )
            ]
        )
    return SpecError([SpecIssue(filename, None, "", f"invalid YAML: {exc}.")])


def _expanded_size(root: Any, limit: int) -> int:
    """How many nodes the tree becomes once every alias is expanded (capped at limit + 1), counted
    once per distinct node: an alias bomb is refused before it is built. A node that holds itself
    (`&a [*a]`) counts as too big."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, closing = stack.pop()
        items = node.value if isinstance(node.value, list) else []  # a scalar's value is its text
        children = [c for item in items for c in (item if isinstance(item, tuple) else (item,))]
        if closing:
            open_nodes.discard(id(node))
            sizes[id(node)] = min(limit + 1, 1 + sum(sizes[id(c)] for c in children))
            continue
        if id(node) in sizes:
            continue
        if id(node) in open_nodes:
            return limit + 1
        open_nodes.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


def compose_yaml(text: str, filename: str) -> tuple[Any, _Builder]:
    """Compose the YAML text and build data + line map, turning every YAML failure into SpecError."""
    import yaml

    try:  # the reader checks every character as the loader is made
        loader = yaml.SafeLoader(text)
    except yaml.YAMLError as exc:
        raise _yaml_error(filename, exc, text) from None
    builder = _Builder(loader, filename)
    try:
        node = loader.get_single_node()
        if node is not None and _expanded_size(node, _MAX_NODES_BUILT) > _MAX_NODES_BUILT:
            raise _TooBig()
        data = None if node is None else builder.build(node, (), node.start_mark.line + 1)
    except (yaml.YAMLError, ValueError, TypeError, AttributeError) as exc:
        # ValueError & co.: PyYAML constructors choking on e.g. `!!timestamp nonsense`
        if isinstance(exc, yaml.YAMLError):
            raise _yaml_error(filename, exc, text) from None
        raise SpecError([SpecIssue(filename, None, "", f"invalid YAML value: {exc}.")]) from None
    except (RecursionError, _TooBig):
        raise SpecError(
            [SpecIssue(filename, None, "", "the YAML document is nested or aliased far too deeply to be a job file.")]
        ) from None
    finally:
        loader.dispose()
    return data, builder
