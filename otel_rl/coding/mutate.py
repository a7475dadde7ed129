"""Bug injection by AST mutation: every site in a module's functions where a small mutator applies, and the
source with one of them applied (only that expression's or statement's text changes)."""

import ast
from collections.abc import Iterator
from dataclasses import dataclass

# Each comparison operator and the one it becomes, with their source spellings.
COMPARISON_SWAPS: dict[type[ast.cmpop], str] = {
    ast.Lt: "<=",
    ast.LtE: "<",
    ast.Gt: ">=",
    ast.GtE: ">",
    ast.Eq: "!=",
    ast.NotEq: "==",
    ast.In: "not in",
    ast.NotIn: "in",
    ast.Is: "is not",
    ast.IsNot: "is",
}
# Operators whose operands' order matters.
NON_COMMUTATIVE: dict[type[ast.operator], str] = {
    ast.Sub: "-",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
    ast.LShift: "<<",
    ast.RShift: ">>",
}
# Operands that keep their meaning unparenthesized on either side of an operator.
ATOMS = (ast.Name, ast.Constant, ast.Attribute, ast.Call, ast.Subscript)
MUTATORS = ("swap_comparison", "off_by_one", "invert_condition", "drop_statement", "swap_operands")


@dataclass(frozen=True, order=True)
class Mutation:
    """One edit: the characters [start, end) of the source become `new`."""

    function: str
    line: int
    start: int
    end: int
    mutator: str
    new: str


def apply(source: str, mutation: Mutation) -> str:
    return source[: mutation.start] + mutation.new + source[mutation.end :]


class _Offsets:
    """Character offsets of AST positions (ast counts columns in UTF-8 bytes)."""

    def __init__(self, source: str) -> None:
        self._lines = source.splitlines(keepends=True)
        self._starts = [0]
        for line in self._lines:
            self._starts.append(self._starts[-1] + len(line))

    def at(self, line: int, byte_col: int) -> int:
        text = self._lines[line - 1].encode()[:byte_col].decode()
        return self._starts[line - 1] + len(text)

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.at(node.lineno, node.col_offset), self.at(node.end_lineno, node.end_col_offset)


def _one_line(node: ast.AST) -> bool:
    return getattr(node, "end_lineno", None) == getattr(node, "lineno", 0)


def _operand(source: str, offsets: _Offsets, node: ast.expr) -> str:
    start, end = offsets.span(node)
    text = source[start:end]
    return text if isinstance(node, ATOMS) else f"({text})"


def _is_docstring(body: list[ast.stmt], index: int) -> bool:
    statement = body[index]
    return (
        index == 0
        and isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def _sites_in(function: ast.FunctionDef, source: str, offsets: _Offsets) -> Iterator[Mutation]:
    name = function.name

    def edit(node: ast.AST, mutator: str, new: str) -> Mutation:
        return Mutation(name, node.lineno, *offsets.span(node), mutator, new)

    statements = function.body
    for node in ast.walk(ast.Module(body=statements, type_ignores=[])):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and _one_line(node):
            spelling = COMPARISON_SWAPS.get(type(node.ops[0]))
            if spelling:  # the operator's text, between the operands, is all that changes
                _, left_end = offsets.span(node.left)
                right_start, _ = offsets.span(node.comparators[0])
                yield Mutation(name, node.lineno, left_end, right_start, "swap_comparison", f" {spelling} ")
        elif isinstance(node, ast.Constant) and type(node.value) is int and _one_line(node):
            yield edit(node, "off_by_one", str(node.value + 1))
        elif isinstance(node, ast.If | ast.While) and _one_line(node.test):
            start, end = offsets.span(node.test)
            yield Mutation(name, node.lineno, start, end, "invert_condition", f"not ({source[start:end]})")
        elif isinstance(node, ast.BinOp) and type(node.op) in NON_COMMUTATIVE and _one_line(node):
            left, right = _operand(source, offsets, node.left), _operand(source, offsets, node.right)
            if left != right:
                yield edit(node, "swap_operands", f"{right} {NON_COMMUTATIVE[type(node.op)]} {left}")
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if not isinstance(body, list) or len(body) < 2:
                continue
            for index, statement in enumerate(body):
                droppable = _one_line(statement) and not isinstance(statement, ast.Pass)
                if droppable and not _is_docstring(body, index):
                    yield edit(statement, "drop_statement", "pass")


def mutations(source: str) -> list[Mutation]:
    """Every mutation of the module's top-level functions (their nested code included), sorted (the same
    source gives the same list). Each changes the program by construction; `mutant()` checks it parses."""
    tree = ast.parse(source)
    offsets = _Offsets(source)
    found = {
        mutation
        for function in tree.body
        if isinstance(function, ast.FunctionDef)
        for mutation in _sites_in(function, source, offsets)
    }
    return sorted(found)


def mutant(source: str, mutation: Mutation) -> str | None:
    """The mutated source, or None when it does not parse or is the same program (a check that costs a
    parse of the module: done for the mutations tried, not for every site)."""
    changed = apply(source, mutation)
    try:
        return changed if ast.dump(ast.parse(changed)) != ast.dump(ast.parse(source)) else None
    except SyntaxError:
        return None
