import { all, create, type MathNode } from "mathjs";

const math = create(all);

/** Functions `calc` may call; everything else (import, evaluate, createUnit, parse…) is refused. */
const FUNCTIONS = new Set([
  "abs", "sqrt", "cbrt", "exp", "log", "log10", "log2", "pow", "round", "floor", "ceil", "fix", "sign",
  "min", "max", "mod", "gcd", "lcm", "factorial", "sin", "cos", "tan", "asin", "acos", "atan", "atan2",
  "sinh", "cosh", "tanh", "hypot", "mean", "median", "sum", "prod", "nthRoot",
]);
const CONSTANTS = new Set(["pi", "e", "tau", "phi"]);
const OPERATORS = new Set(["add", "subtract", "multiply", "divide", "pow", "mod", "unaryMinus", "unaryPlus", "factorial"]);

const REFUSED_KIND: Record<string, string> = {
  AssignmentNode: "assignments",
  FunctionAssignmentNode: "function definitions",
  AccessorNode: "property accesses",
  IndexNode: "index expressions",
  BlockNode: "several statements",
  ArrayNode: "arrays and matrices",
  ObjectNode: "objects",
  ConditionalNode: "conditionals",
  RangeNode: "ranges",
  RelationalNode: "comparisons",
};

/** Longest expression accepted, in characters. */
export const MAX_EXPRESSION_LENGTH = 500;

/**
 * Evaluates an arithmetic expression with mathjs, restricted: the parse tree
 * may hold only number constants, the operators `+ - * / ^ % !`, parentheses,
 * the constants `pi e tau phi` and a fixed list of math functions. Assignments,
 * function definitions, imports, units, strings, matrices, property access and
 * several statements are refused before anything is evaluated — never `eval`.
 * Results are formatted with 14 significant digits (`0.1 + 0.2` → `0.3`).
 * @throws Error with a message meant for the model (the tool server returns it as content).
 */
export function evaluateExpression(expression: string): string {
  if (typeof expression !== "string" || expression.trim() === "") throw new Error("expression is empty");
  if (expression.length > MAX_EXPRESSION_LENGTH) throw new Error(`expression is longer than ${MAX_EXPRESSION_LENGTH} characters`);
  let node: MathNode;
  try {
    node = math.parse(expression);
  } catch (e) {
    throw new Error(`cannot parse expression: ${(e as Error).message}`);
  }
  let refused: string | undefined;
  node.traverse((n, path, parent) => {
    if (refused) return;
    switch (n.type) {
      case "ConstantNode": {
        const v = (n as unknown as { value: unknown }).value;
        if (typeof v !== "number") refused = "only numbers are allowed as constants";
        break;
      }
      case "ParenthesisNode":
        break;
      case "OperatorNode": {
        const fn = (n as unknown as { fn: string }).fn;
        if (!OPERATORS.has(fn)) refused = `operator '${(n as unknown as { op: string }).op}' is not allowed`;
        break;
      }
      case "FunctionNode": {
        const fnNode = (n as unknown as { fn: MathNode }).fn;
        const name = fnNode.type === "SymbolNode" ? (fnNode as unknown as { name: string }).name : undefined;
        if (!name || !FUNCTIONS.has(name)) refused = `function '${name ?? "?"}' is not allowed`;
        break;
      }
      case "SymbolNode": {
        const name = (n as unknown as { name: string }).name;
        const isCallee = parent?.type === "FunctionNode" && path === "fn";
        if (!isCallee && !CONSTANTS.has(name)) refused = `unknown symbol '${name}' (variables, units and assignments are not allowed)`;
        break;
      }
      default:
        refused = `${REFUSED_KIND[n.type] ?? n.type.replace(/Node$/, "").toLowerCase() + " expressions"} are not allowed`;
    }
  });
  if (refused) throw new Error(refused);
  let value: unknown;
  try {
    value = node.compile().evaluate({});
  } catch (e) {
    throw new Error(`cannot evaluate expression: ${(e as Error).message}`);
  }
  return math.format(value as number, { precision: 14 });
}

/**
 * The `content` the example `calc` tool answers for a call's `arguments`
 * (`{expression: string}`; a number is taken as its text): the value from
 * {@link evaluateExpression}, or `Error: <reason>` — never throws. The tool
 * server (`infra/tools/app.ts`) and the example agent (`infra/agent-example`)
 * both answer with it, so the same call gets the same text from either.
 */
export function calcToolContent(args: Record<string, unknown>): string {
  const v = args.expression;
  const expr = typeof v === "string" ? v : typeof v === "number" ? String(v) : undefined;
  if (expr === undefined) return "Error: calc needs a string argument 'expression'.";
  try {
    return evaluateExpression(expr);
  } catch (e) {
    return `Error: ${(e as Error).message}`;
  }
}
