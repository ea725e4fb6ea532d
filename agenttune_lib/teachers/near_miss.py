"""Near-miss no-tool prompts: a retail request offered only sibling retail tools that cannot serve it.

BFCL-irrelevance-like prompts offer a tool of the question's own domain that does something else (a
triangle's area, offered a BMI tool). Contrast with far-off tools alone teaches a student to decline only
when no word of the question matches a tool, so it calls a near tool anyway. These prompts are built from
the τ² retail database (real order ids, emails, names, products) and its real tools: each request names
the tool that would serve it, and the prompt offers one or two others, preferring those whose names share
its words (``get_order_details`` for an item's price); the reply says what the offered tools do and why none fits.
"""
from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["NEAR_MISS_NEEDS", "NearMissNeed", "near_miss_item"]


@dataclasses.dataclass(frozen=True)
class NearMissNeed:
    """A retail request: the tool that serves it, others that also could, what it asks, and its prompt from the DB."""

    tool: str
    also: tuple[str, ...]
    asks: str
    prompt: Callable[[Mapping[str, Any], random.Random], str]


def _pick(db: Mapping[str, Any], table: str, rng: random.Random, where: Callable[[Any], bool] = lambda _: True) -> Any:
    rows = [row for row in db[table].values() if where(row)]
    return rows[rng.randrange(len(rows))]


def _address(user: Mapping[str, Any]) -> str:
    a = user["address"]
    return f"{a['address1']}, {a['city']}, {a['state']} {a['zip']}"


def _order_status(db, rng):
    return f"What is the status of my order {_pick(db, 'orders', rng)['order_id']}?"


def _by_email(db, rng):
    return f"What is the user id for the email address {_pick(db, 'users', rng)['email']}?"


def _by_name_zip(db, rng):
    u = _pick(db, "users", rng)
    return f"Find the user id of {u['name']['first_name']} {u['name']['last_name']}, zip code {u['address']['zip']}."


def _product_types(db, rng):
    return rng.choice(("Which product types does the store sell?", "List every kind of product you carry."))


def _product_stock(db, rng):
    p = _pick(db, "products", rng)
    return f"Which variants of the {p['name']} (product id {p['product_id']}) are in stock?"


def _item_price(db, rng):
    p = _pick(db, "products", rng)
    item = rng.choice(sorted(p["variants"]))
    return f"Is item {item} available, and what does it cost?"


def _cancel(db, rng):
    o = _pick(db, "orders", rng, lambda o: o.get("status") == "pending")
    return f"Please cancel my pending order {o['order_id']}; I ordered it by mistake."


def _order_address(db, rng):
    o, u = _pick(db, "orders", rng, lambda o: o.get("status") == "pending"), _pick(db, "users", rng)
    return f"Ship my pending order {o['order_id']} to {_address(u)} instead."


def _user_address(db, rng):
    u, other = _pick(db, "users", rng), _pick(db, "users", rng)
    return f"Change the default address of user {u['user_id']} to {_address(other)}."


def _arithmetic(db, rng):
    a, b, c = rng.randint(12, 99), rng.randint(3, 19), rng.randint(100, 999)
    return rng.choice((f"What is {a} * {b} + {c}?", f"Compute ({c} - {a}) / {b}.", f"What is {a} percent of {c}?"))


def _return_items(db, rng):
    o = _pick(db, "orders", rng, lambda o: o.get("status") == "delivered")
    return f"I want to return the {o['items'][0]['name']} from my delivered order {o['order_id']}."


def _human(db, rng):
    return rng.choice(("Can I talk to a human agent, please?", "Please put me through to a person on your staff."))


def _user_details(db, rng):
    return f"Show me the account details and orders of user {_pick(db, 'users', rng)['user_id']}."


#: One request per retail tool but the hand-off (a human agent could serve any request, so it is never a distractor).
NEAR_MISS_NEEDS: tuple[NearMissNeed, ...] = (
    NearMissNeed("get_order_details", (), "look up an order's status", _order_status),
    NearMissNeed("find_user_id_by_email", (), "find a user id from an email address", _by_email),
    NearMissNeed("find_user_id_by_name_zip", (), "find a user id from a name and zip code", _by_name_zip),
    NearMissNeed("list_all_product_types", (), "list the store's product types", _product_types),
    NearMissNeed("get_product_details", (), "show a product's variants and stock", _product_stock),
    NearMissNeed("get_item_details", ("get_product_details",), "show an item's availability and price", _item_price),
    NearMissNeed("cancel_pending_order", (), "cancel an order", _cancel),
    NearMissNeed("modify_pending_order_address", (), "change an order's shipping address", _order_address),
    NearMissNeed("modify_user_address", (), "change a user's default address", _user_address),
    NearMissNeed("calculate", (), "evaluate arithmetic", _arithmetic),
    NearMissNeed("return_delivered_order_items", (), "return delivered items", _return_items),
    NearMissNeed("transfer_to_human_agents", (), "transfer you to a human agent", _human),
    NearMissNeed("get_user_details", (), "show a user's account details", _user_details),
)
_NEVER_OFFERED = "transfer_to_human_agents"


def _words(name: str) -> set[str]:
    return set(re.split(r"[_\W]+", name.lower())) - {"", "get", "by"}


def _does(tool: Any) -> str:
    """The tool's description as a clause: "gets inventory details of a product"."""
    text = str(getattr(tool, "description", "") or "").strip().rstrip(".").split("\n")[0]
    if not text:
        return "does something else"
    verb, _, rest = text.partition(" ")
    verb = verb.lower()
    if verb.endswith("y") and verb[-2:-1] not in "aeiou":
        verb = verb[:-1] + "ies"  # "modify" -> "modifies"
    else:
        verb += "es" if verb.endswith(("s", "sh", "ch", "x")) else "s"
    return f"{verb} {rest}".strip()


def near_miss_item(need: NearMissNeed, retail_tools: Sequence[Any], db: Mapping[str, Any],
                   rng: random.Random) -> dict[str, Any] | None:
    """(``prompt``, ``answer``, ``tools``) for ``need``: one or two sibling tools offered, none of which serves it.

    None when ``retail_tools`` hold no sibling (every offered tool must be one that cannot serve the request).
    """
    banned = {need.tool, *need.also, _NEVER_OFFERED}
    others = [t for t in retail_tools if t.name not in banned]
    if not others:
        return None
    want = _words(need.tool)
    overlap = max(len(_words(t.name) & want) for t in others)
    near = [t for t in others if len(_words(t.name) & want) == overlap]
    tools = rng.sample(near, k=min(len(near), 1 if rng.random() < 0.6 else 2))
    if len(tools) == 1:
        answer = (f"The only tool I have is {tools[0].name}, which {_does(tools[0])}; it cannot {need.asks}, "
                  "so I will not call it for this request.")
    else:
        clauses = "; ".join(f"{t.name} {_does(t)}" for t in tools)
        answer = f"The tools I have cannot do this: {clauses}; neither can {need.asks}, so I will not call them for this request."
    return {"prompt": need.prompt(db, rng), "answer": answer, "tools": tools}
