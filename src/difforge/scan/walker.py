"""One pass over one parsed file: the context every rule needs, and the rules' hooks called in order.

The walker visits the tree once, in source order, and keeps what a single node cannot tell about
itself: whether it runs at import time (module level, class bodies, decorators, default values, but
not under ``if __name__ == "__main__":``), which ``try`` bodies and ``if`` branches it sits in, whether
it only runs on CUDA (the body of ``if torch.cuda.is_available():`` / ``if x.type == "cuda":``), whether
it is part of a comparison, the import aliases of the file (``import torch.nn.functional as F``), the
``nn.Embedding`` attributes of the enclosing class, and the dtype flow of the current function.

Rules never walk the tree themselves (one parse, one pass); a rule that judges a whole function
(device detection) collects in :attr:`Scope.state` and answers when the function ends.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from typing import Any

from .flow import Flow

#: ``hook(node, dotted_name_or_None, walker)``: the dotted name is the callee of a Call, the whole
#: chain of an Attribute (``torch.cuda.amp.autocast``), None for other nodes.
Hook = Callable[[Any, "str | None", "Walker"], None]
#: ``finish(scope, walker)``: called when a function (or the module) has been visited.
Finish = Callable[["Scope", "Walker"], None]
#: One raw hit: rule id, line, column, detail text, severity override (None: the rule's for the target).
Hit = tuple[str, int, int, str, "str | None"]

_CUDA_AVAILABLE = frozenset({"torch.cuda.is_available", "torch.cuda.device_count"})


#: Fields that never hold a node worth visiting (names, operators, load/store contexts, literals).
_SCALAR_FIELDS = frozenset({"id", "ctx", "op", "ops", "attr", "name", "names", "asname", "module", "level", "arg",
                            "kind", "type_comment", "conversion", "is_async", "simple", "lineno", "tag"})
_NODE_CLASSES = tuple(c for c in vars(ast).values() if isinstance(c, type) and issubclass(c, ast.AST))
_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}


def _child_fields(cls: type) -> tuple[str, ...]:
    """The fields of ``cls`` that can hold child nodes (cached per class)."""
    fields = _CHILD_FIELDS.get(cls)
    if fields is None:
        if cls is ast.Constant or cls.__name__ == "MatchSingleton":
            fields = ()
        else:
            fields = tuple(f for f in getattr(cls, "_fields", ()) if f not in _SCALAR_FIELDS)
        _CHILD_FIELDS[cls] = fields
    return fields


class Scope:
    """A function (or the module): its dtype flow and the rules' own per-function notes."""

    __slots__ = ("flow", "node", "state")

    def __init__(self, node: ast.AST, dotted: Callable[[ast.AST], str | None]) -> None:
        self.node = node
        self.flow = Flow(dotted)
        self.state: dict[str, Any] = {}


def is_cuda_string(value: object) -> bool:
    """``"cuda"`` or ``"cuda:N"`` exactly (not prose that happens to start with the word)."""
    if not isinstance(value, str) or not value.startswith("cuda"):
        return False
    return value == "cuda" or (value[4:5] == ":" and value[5:].isdigit())


def is_cuda_fstring(node: ast.AST) -> bool:
    """``f"cuda:{index}"``: a literal ``cuda:`` followed by one formatted value, nothing else."""
    if not isinstance(node, ast.JoinedStr) or len(node.values) != 2:
        return False
    head, tail = node.values
    return (isinstance(head, ast.Constant) and head.value in ("cuda:", "cuda")
            and isinstance(tail, ast.FormattedValue))


class Walker:
    """Visits one module tree once and collects the rules' hits (see the module docstring)."""

    def __init__(self, hooks: dict[type, list[Hook]], finishers: Iterable[Finish], target: str) -> None:
        self.hooks = hooks
        self.finishers = tuple(finishers)
        self.target = target
        self.aliases: dict[str, str] = {}
        self.stack: list[ast.AST] = []
        self.hits: list[Hit] = []
        self.consumed: set[int] = set()
        self.import_time = True
        self.catches: list[frozenset[str]] = []
        self.if_depth = 0
        self.tests: list[ast.expr] = []
        self.cuda_guard = 0
        self.compare_depth = 0
        self.type_checking = 0
        self.class_embeddings: list[set[str]] = []
        self.class_names: list[str] = []
        self.scope = Scope(ast.Module(body=[], type_ignores=[]), self.dotted)
        self._special: dict[type, Callable[[Any], None]] = {
            ast.FunctionDef: self._function, ast.AsyncFunctionDef: self._function, ast.Lambda: self._lambda,
            ast.ClassDef: self._class, ast.If: self._if, ast.IfExp: self._ifexp, ast.Try: self._try,
            ast.With: self._with, ast.AsyncWith: self._with, ast.Compare: self._compare,
            ast.Assign: self._assign, ast.AnnAssign: self._annassign, ast.AugAssign: self._augassign,
            ast.NamedExpr: self._namedexpr, ast.For: self._for, ast.AsyncFor: self._for, ast.Expr: self._expr,
            ast.Import: self._import, ast.ImportFrom: self._import, ast.BoolOp: self._boolop,
        }
        if hasattr(ast, "TryStar"):
            self._special[ast.TryStar] = self._try
        #: Node classes with nothing to check and nothing below (Name, Load, operators ...): never visited.
        self._leaves = frozenset(c for c in _NODE_CLASSES if not _child_fields(c) and c not in hooks
                                 and c not in self._special)

    # ---- what rules ask -------------------------------------------------------------------------------
    @property
    def parent(self) -> ast.AST | None:
        """The node enclosing the one being checked."""
        return self.stack[-1] if self.stack else None

    def dotted(self, node: ast.AST) -> str | None:
        """``a.b.c`` for a Name/Attribute chain, with the file's import aliases applied to the root."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        parts.append(self.aliases.get(node.id, node.id))
        return ".".join(reversed(parts))

    def caught(self, *names: str) -> bool:
        """Whether an enclosing ``try`` body has a handler for one of ``names`` (or a broad one)."""
        for handled in self.catches:
            if "*" in handled or "Exception" in handled or "BaseException" in handled:
                return True
            if any(n in handled for n in names):
                return True
        return False

    @property
    def in_try(self) -> bool:
        return bool(self.catches)

    @property
    def conditional(self) -> bool:
        """Inside an ``if`` (or conditional expression) branch, or under ``if TYPE_CHECKING:``."""
        return self.if_depth > 0 or self.type_checking > 0

    @property
    def embeddings(self) -> set[str] | frozenset[str]:
        """``self.<name>`` attributes the enclosing class's ``__init__`` assigned an ``nn.Embedding`` so far.

        Collected while ``__init__`` is visited, so methods defined above ``__init__`` are not covered.
        """
        return self.class_embeddings[-1] if self.class_embeddings else frozenset()

    def branch_mentions(self, words: Iterable[str]) -> bool:
        """Whether the test of an enclosing ``if`` (of this function) names one of ``words``, e.g. ``is_npu``:
        the code there was written knowing that device."""
        words = tuple(words)
        for test in self.tests:
            for sub in ast.walk(test):
                text = sub.id if isinstance(sub, ast.Name) else sub.attr if isinstance(sub, ast.Attribute) else (
                    sub.value if isinstance(sub, ast.Constant) and isinstance(sub.value, str) else None)
                if text is not None and any(w in text.lower() for w in words):
                    return True
        return False

    def consume(self, node: ast.AST) -> None:
        """Mark ``node`` and everything under it as reported (a later, broader rule stays quiet)."""
        for sub in ast.walk(node):
            self.consumed.add(id(sub))

    def is_consumed(self, node: ast.AST) -> bool:
        return id(node) in self.consumed

    def report(self, rule: str, node: ast.AST, detail: str, severity: str | None = None) -> None:
        self.hits.append((rule, getattr(node, "lineno", 1), getattr(node, "col_offset", 0), detail, severity))

    def is_cuda_test(self, test: ast.AST) -> bool:
        """Whether ``test`` holds only where the device is CUDA (so its ``if`` body is CUDA-only code)."""
        if isinstance(test, ast.BoolOp):
            parts = [self.is_cuda_test(v) for v in test.values]
            return any(parts) if isinstance(test.op, ast.And) else all(parts)
        if isinstance(test, ast.Call):
            return self.dotted(test.func) in _CUDA_AVAILABLE
        if isinstance(test, ast.Attribute):
            return test.attr == "is_cuda"
        if isinstance(test, ast.Name):
            return test.id in ("is_cuda", "use_cuda", "on_cuda", "cuda_available")
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            op, right = test.ops[0], test.comparators[0]
            sides = (test.left, right)
            if isinstance(op, ast.Eq | ast.Is):
                return any(isinstance(s, ast.Constant) and is_cuda_string(s.value) for s in sides)
            if isinstance(op, ast.In) and isinstance(right, ast.Tuple | ast.List | ast.Set):
                return all(isinstance(e, ast.Constant) and is_cuda_string(e.value) for e in right.elts)
            if isinstance(op, ast.Gt) and isinstance(test.left, ast.Call):
                return self.dotted(test.left.func) == "torch.cuda.device_count"
        return False

    # ---- the pass -------------------------------------------------------------------------------------
    def run(self, tree: ast.Module) -> list[Hit]:
        self.scope = Scope(tree, self.dotted)
        self.stack.append(tree)
        self._each(tree.body)
        self.stack.pop()
        self._finish(self.scope)
        return self.hits

    def visit(self, node: ast.AST) -> None:
        cls = node.__class__
        hooks = self.hooks.get(cls)
        if hooks is not None:
            name: str | None = None
            if cls is ast.Call:
                name = self.dotted(node.func)  # type: ignore[attr-defined]
            elif cls is ast.Attribute:
                # Only the whole chain: ``torch.cuda.amp.autocast``, not ``torch.cuda.amp`` inside it.
                hooks = None if self.stack and self.stack[-1].__class__ is ast.Attribute else hooks
                name = self.dotted(node) if hooks else None
            for hook in hooks or ():
                hook(node, name, self)
        special = self._special.get(cls)
        if special is not None:
            special(node)
            return
        self._children(node, _child_fields(cls))

    def _children(self, node: ast.AST, fields: tuple[str, ...]) -> None:
        """Visit ``node``'s children in ``fields`` (a hand-rolled ``iter_child_nodes``: the hot loop)."""
        if not fields:
            return
        leaves = self._leaves
        self.stack.append(node)
        for f in fields:
            value = getattr(node, f, None)
            if value.__class__ is list:
                for item in value:
                    if item.__class__ not in leaves and isinstance(item, ast.AST):
                        self.visit(item)
            elif value is not None and value.__class__ not in leaves and isinstance(value, ast.AST):
                self.visit(value)
        self.stack.pop()

    def _each(self, value: Any) -> None:
        if isinstance(value, list):
            guarded = 0
            for item in value:
                if isinstance(item, ast.AST):
                    self.visit(item)
                    if item.__class__ is ast.If and self._exits_unless_cuda(item):
                        # ``if not cuda: raise/return`` - everything after it in this block runs on CUDA only.
                        guarded += 1
                        self.cuda_guard += 1
            self.cuda_guard -= guarded
        elif isinstance(value, ast.AST):
            self.visit(value)

    def is_not_cuda_test(self, test: ast.AST) -> bool:
        """``not torch.cuda.is_available()``, ``x.type != "cuda"``: holds exactly where the device is not CUDA."""
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self.is_cuda_test(test.operand)
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            op, right = test.ops[0], test.comparators[0]
            if isinstance(op, ast.NotEq | ast.IsNot):
                return any(isinstance(s, ast.Constant) and is_cuda_string(s.value) for s in (test.left, right))
            if isinstance(op, ast.NotIn) and isinstance(right, ast.Tuple | ast.List | ast.Set):
                return all(isinstance(e, ast.Constant) and is_cuda_string(e.value) for e in right.elts)
        return False

    def _exits_unless_cuda(self, node: ast.If) -> bool:
        return (not node.orelse and bool(node.body)
                and isinstance(node.body[-1], ast.Raise | ast.Return | ast.Continue | ast.Break)
                and self.is_not_cuda_test(node.test))

    def _finish(self, scope: Scope) -> None:
        for finish in self.finishers:
            finish(scope, self)

    # ---- nodes that change the context ----------------------------------------------------------------
    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.stack.append(node)
        self._each(node.decorator_list)  # decorators and defaults run where the def runs
        self._each(node.args)
        self._each(node.returns)
        saved = (self.import_time, self.catches, self.if_depth, self.cuda_guard, self.type_checking, self.scope,
                 self.tests)
        self.import_time, self.catches, self.if_depth, self.type_checking, self.tests = False, [], 0, 0, []
        # A function named for CUDA (``_check_device_cuda``, ``get_torch_cuda_device_capability``), or a
        # method of a class named for it (``CUDABackend``), is CUDA-only by design: its body is treated
        # like the body of ``if torch.cuda.is_available():``.
        named = "cuda" in node.name.lower() or any("cuda" in c.lower() for c in self.class_names)
        self.cuda_guard = 1 if named else 0
        self.scope = Scope(node, self.dotted)
        if named:
            self.scope.state["cuda_named"] = True
        self._each(node.body)
        self._finish(self.scope)
        (self.import_time, self.catches, self.if_depth, self.cuda_guard, self.type_checking, self.scope,
         self.tests) = saved
        self.stack.pop()

    def _lambda(self, node: ast.Lambda) -> None:
        self.stack.append(node)
        self._each(node.args)
        saved, self.import_time = self.import_time, False
        self._each(node.body)
        self.import_time = saved
        self.stack.pop()

    def _class(self, node: ast.ClassDef) -> None:
        self.stack.append(node)
        self._each(node.decorator_list)
        self._each(node.bases)
        self._each(node.keywords)
        self.class_embeddings.append(set())
        self.class_names.append(node.name)
        self._each(node.body)
        self.class_names.pop()
        self.class_embeddings.pop()
        self.stack.pop()

    def _note_embedding(self, node: ast.Assign) -> None:
        """``self.x = nn.Embedding(...)`` in ``__init__``: remember ``x`` for the class's other methods."""
        callee = self.dotted(node.value.func) or ""  # type: ignore[attr-defined]
        if callee.endswith(".from_pretrained"):
            callee = callee[: -len(".from_pretrained")]
        if callee in ("Embedding", "torch.nn.Embedding") or callee.endswith(".Embedding"):
            for t in node.targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    self.class_embeddings[-1].add(t.attr)

    def _branches(self, node: ast.If | ast.IfExp, body_cuda: bool, orelse_cuda: bool) -> None:
        self.tests.append(node.test)
        self.if_depth += 1
        self.cuda_guard += body_cuda
        self._each(node.body)
        self.cuda_guard -= body_cuda
        self.cuda_guard += orelse_cuda
        self._each(node.orelse)
        self.cuda_guard -= orelse_cuda
        self.if_depth -= 1
        self.tests.pop()

    def _if(self, node: ast.If) -> None:
        self.stack.append(node)
        self.visit(node.test)
        test = node.test
        cuda = self.is_cuda_test(test)
        not_cuda = self.is_not_cuda_test(test)
        if not_cuda and node.body and isinstance(node.body[-1], ast.Raise):
            # ``if not cuda: raise ...``: this code states that it needs CUDA (a CUDA-only kernel, a
            # CUDA-only quantiser); that is a requirement, not device detection that forgot a backend.
            self.scope.state["cuda_required"] = True
        main = (self.scope.node.__class__ is ast.Module and isinstance(test, ast.Compare)
                and isinstance(test.left, ast.Name) and test.left.id == "__name__")
        typing_only = (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
        saved = self.import_time
        if main:
            self.import_time = False  # a script's entry point, not import time
        self.type_checking += typing_only
        self._branches(node, cuda, not_cuda)
        self.type_checking -= typing_only
        self.import_time = saved
        self.stack.pop()

    def _ifexp(self, node: ast.IfExp) -> None:
        self.stack.append(node)
        self.visit(node.test)
        self._branches(node, self.is_cuda_test(node.test), False)
        self.stack.pop()

    @staticmethod
    def _handler_names(handler: ast.expr | None) -> set[str]:
        if handler is None:
            return {"*"}
        elts = handler.elts if isinstance(handler, ast.Tuple) else [handler]
        out: set[str] = set()
        for e in elts:
            if isinstance(e, ast.Name):
                out.add(e.id)
            elif isinstance(e, ast.Attribute):
                out.add(e.attr)
        return out

    def _try(self, node: ast.Try) -> None:
        self.stack.append(node)
        handled: set[str] = set()
        for h in node.handlers:
            handled |= self._handler_names(h.type)
        self.catches.append(frozenset(handled) if node.handlers else frozenset())
        self._each(node.body)
        self.catches.pop()
        self._each(node.handlers)
        self._each(node.orelse)
        self._each(node.finalbody)
        self.stack.pop()

    def _with(self, node: ast.With | ast.AsyncWith) -> None:
        self.stack.append(node)
        self._each(node.items)
        handled: set[str] = set()
        for item in node.items:
            expr = item.context_expr
            if isinstance(expr, ast.Call) and (self.dotted(expr.func) or "").endswith("suppress"):
                for arg in expr.args:
                    handled |= self._handler_names(arg) - {"*"}
        if handled:
            self.catches.append(frozenset(handled))
        self._each(node.body)
        if handled:
            self.catches.pop()
        self.stack.pop()

    def _boolop(self, node: ast.BoolOp) -> None:
        """``torch.cuda.is_available() and torch.cuda.get_device_capability() ...``: the rest of an ``and``
        after a CUDA test only runs on CUDA."""
        self.stack.append(node)
        guarded = 0
        for value in node.values:
            self.visit(value)
            if isinstance(node.op, ast.And) and self.is_cuda_test(value):
                guarded += 1
                self.cuda_guard += 1
        self.cuda_guard -= guarded
        self.stack.pop()

    def _compare(self, node: ast.Compare) -> None:
        self.stack.append(node)
        self.compare_depth += 1
        self.visit(node.left)
        self._each(node.comparators)
        self.compare_depth -= 1
        self.stack.pop()

    def _assign(self, node: ast.Assign) -> None:
        self.stack.append(node)
        self.visit(node.value)
        self._each(node.targets)
        self.stack.pop()
        for target in node.targets:
            self.scope.flow.assign(target, node.value)
        if (self.class_embeddings and isinstance(node.value, ast.Call)
                and getattr(self.scope.node, "name", None) == "__init__"):
            self._note_embedding(node)

    def _annassign(self, node: ast.AnnAssign) -> None:
        self.stack.append(node)
        self._each(node.value)
        self.visit(node.target)
        self.stack.pop()
        if node.value is not None:
            self.scope.flow.assign(node.target, node.value)

    def _augassign(self, node: ast.AugAssign) -> None:
        self.stack.append(node)
        self.visit(node.value)
        self.visit(node.target)
        self.stack.pop()
        self.scope.flow.augassign(node)

    def _namedexpr(self, node: ast.NamedExpr) -> None:
        self.stack.append(node)
        self.visit(node.value)
        self.stack.pop()
        self.scope.flow.assign(node.target, node.value)

    def _for(self, node: ast.For | ast.AsyncFor) -> None:
        self.stack.append(node)
        self.visit(node.iter)
        self.scope.flow.assign(node.target, None)
        self._each(node.body)
        self._each(node.orelse)
        self.stack.pop()

    def _expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return  # a docstring or a bare string: prose, never code
        self.stack.append(node)
        self.visit(node.value)
        self.stack.pop()

    def _import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    self.aliases[a.asname] = a.name
                else:
                    top = a.name.split(".", 1)[0]
                    self.aliases.setdefault(top, top)
        elif not node.level and node.module:
            for a in node.names:
                if a.name != "*":
                    self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
