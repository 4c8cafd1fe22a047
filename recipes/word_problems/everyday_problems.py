"""Word problems in everyday words, as a person writes them: the data of the fine-tuning recipe (docs/training.md).

    python recipes/word_problems/everyday_problems.py --count 400 --out recipes/word_problems/work/everyday.jsonl

`problems.py` writes the target's world in a few fixed phrasings; `weights/handwritten_problems.jsonl` asks the same
kinds of question the way people do ("Grandma baked 36 cookies for the party and her neighbour brought 17 more").
The target answers those in its own, different way, and the drafter, trained on its answers to generated problems,
guesses them less well. This generator writes *new* problems in the hand-written voice (scenes from daily life, a
cast of relatives and neighbours, "still", "receive", "change", "in all"), so that a drafter can be fine-tuned on the
target's answers to them and then measured on the 20 hand-written ones, which are never written here: no template
is one of their sentences, and a problem whose question equals one of theirs is dropped.

Each line: {"messages": [one user turn], "kind", "answer"}, the format of the shipped prompt sets.

`--replay` writes instead the first questions the demo drafter was trained on (`build_corpus.py`'s training
questions, seed 0, without building the corpus): mixed into the fine-tuning data, the target's answers to them keep
the drafter good at what it was made for.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from dflash.cli import OneLineErrors, UsageError, positive_int, run_cli
from recipes.word_problems.build_corpus import problems_of_split
from recipes.word_problems.paths import WEIGHTS
from recipes.word_problems.problems import chat_messages

PEOPLE = [("Grandpa", "he"), ("Aunt Rosa", "she"), ("Uncle Dev", "he"), ("Aunt Mei", "she"), ("Cousin Ali", "he"),
          ("Coach Lee", "he"), ("Mrs. Ito", "she"), ("Mr. Park", "he"), ("Keisha", "she"), ("Mateo", "he"),
          ("Fatima", "she"), ("Oskar", "he"), ("Bea", "she"), ("Rashid", "he"), ("Ingrid", "she"), ("Tariq", "he")]
THINGS = [("jars of jam", "jar of jam"), ("buttons", "button"), ("tomatoes", "tomato"), ("postcards", "postcard"),
          ("candles", "candle"), ("balloons", "balloon"), ("paper cups", "paper cup"), ("shells", "shell"),
          ("pebbles", "pebble"), ("comic books", "comic book"), ("pancakes", "pancake"), ("socks", "sock"),
          ("carrots", "carrot"), ("beads", "bead"), ("chairs", "chair"), ("bottles of water", "bottle of water")]
PLACES = ["the school fair", "the picnic", "the birthday party", "the market", "the camp", "the bake sale"]
CONTAINERS = [("bag", "bags"), ("basket", "baskets"), ("crate", "crates"), ("tray", "trays"), ("pack", "packs")]
HOLDERS = [("shelf", "shelves"), ("table", "tables"), ("bench", "benches"), ("van", "vans"), ("row", "rows")]
CURRENCIES = ["dollars", "euros", "pounds"]
ACTIVITIES = [("A printer", "prints", "pages"), ("A pump", "fills", "buckets"), ("A machine", "packs", "boxes"),
              ("A cyclist", "rides", "kilometers"), ("A hen house", "lays", "eggs"), ("A fountain", "pours", "liters")]
UNITS = [("hours", "minutes", 60), ("minutes", "seconds", 60), ("meters", "centimeters", 100),
         ("kilometers", "meters", 1000), ("days", "hours", 24), ("weeks", "days", 7)]
UNIT_THINGS = {"hours": "The concert", "minutes": "The song", "meters": "A rope", "kilometers": "The trail",
               "days": "The trip", "weeks": "The holiday"}


def pick_person(rng: random.Random) -> tuple[str, str, str]:
    """A person and the pronoun and possessive a sentence about them needs."""
    name, pronoun = rng.choice(PEOPLE)
    return name, pronoun, {"she": "her", "he": "his"}[pronoun]


def addition(rng):
    (name, she, her), (things, _), place = pick_person(rng), rng.choice(THINGS), rng.choice(PLACES)
    a, b = rng.randint(11, 69), rng.randint(5, 39)
    return rng.choice([
        f"{name} brought {a} {things} to {place}, and a friend brought {b} more. How many {things} are there in all?",
        f"At {place} there were {a} {things} on the table. Then {name} carried in another {b}. "
        f"How many {things} are on the table now?",
        f"{name} counted {a} {things} in the morning. By the evening {she} had found {b} more. "
        f"How many {things} did {she} count altogether?"]), a + b


def subtraction(rng):
    (name, she, her), (things, _) = pick_person(rng), rng.choice(THINGS)
    a = rng.randint(30, 95)
    b = rng.randint(5, a - 5)
    return rng.choice([
        f"{name} had {a} {things}. {she.capitalize()} lost {b} of them on the way home. How many {things} "
        f"does {she} still have?",
        f"A train left the station with {a} people on board. At the next stop {b} people got off. "
        f"How many people are still on the train?",
        f"There were {a} {things} in the cupboard. {name} used {b} of them. How many {things} are left?"]), a - b


def multiplication(rng):
    (name, she, her), (things, _), (box, boxes) = pick_person(rng), rng.choice(THINGS), rng.choice(CONTAINERS)
    a, b = rng.randint(3, 9), rng.randint(3, 9)
    return rng.choice([
        f"Every {box} holds {a} {things}. {name} has {b} {boxes}. How many {things} does {she} have?",
        f"{name} packs {b} {boxes} with {a} {things} in each one. How many {things} did {she} pack?",
        f"A room has {b} {rng.choice(HOLDERS)[1]}, and {a} children sit at each. How many children are in "
        f"the room?"]), a * b


def division(rng):
    (name, she, her), (things, _) = pick_person(rng), rng.choice(THINGS)
    each, groups = rng.randint(3, 9), rng.randint(3, 9)
    total = each * groups
    return rng.choice([
        f"{name} shares {total} {things} equally among {groups} friends. How many {things} does each friend get?",
        f"{total} {things} are packed into {groups} boxes, the same number in every box. How many {things} "
        f"go in one box?",
        f"A teacher hands out {total} {things} evenly to {groups} groups. How many {things} does each group "
        f"receive?"]), each


def two_step(rng):
    (name, she, her), (things, _) = pick_person(rng), rng.choice(THINGS)
    a, b, c = rng.randint(20, 60), rng.randint(3, 15), rng.randint(5, 25)
    if rng.random() < 0.5:
        return (f"{name} picked {a} {things}. {she.capitalize()} gave {b} to {her} cousin and later picked "
                f"{c} more. How many {things} does {name} have now?"), a - b + c
    return (f"{name} collected {a} {things} on Saturday and {c} on Sunday. {she.capitalize()} sold {b} of them. "
            f"How many {things} does {she} have left?"), a + c - b


def three_step(rng):
    (name, she, her), (things, _), (holder, holders) = pick_person(rng), rng.choice(THINGS), rng.choice(HOLDERS)
    rows, per_row = rng.randint(3, 8), rng.randint(4, 9)
    lost, added = rng.randint(2, rows * per_row // 2), rng.randint(2, 12)
    return (f"{name} sets out {rows} {holders} with {per_row} {things} on every {holder}. {lost} of the {things} "
            f"get broken, and then {she} adds {added} more. How many {things} are there now?"), \
        rows * per_row - lost + added


def money(rng):
    name, she, her = pick_person(rng)
    count, price, currency = rng.randint(2, 6), rng.randint(2, 9), rng.choice(CURRENCIES)
    paid = rng.choice([p for p in (20, 50, 100) if p >= count * price])
    item = rng.choice(["notebooks", "tea cups", "flower pots", "pies", "kites"])
    return rng.choice([
        f"{name} buys {count} {item} at {price} {currency} each and pays with {paid} {currency}. "
        f"How much change does {she} get back?",
        f"{count} {item} cost {price} {currency} each. {name} gives the seller {paid} {currency}. "
        f"How much change should {she} receive?"]), paid - count * price


def price(rng):
    count, cost, currency = rng.randint(2, 9), rng.randint(4, 19), rng.choice(CURRENCIES)
    thing = rng.choice(["A bus ticket", "A swim pass", "A bowl of soup", "A concert ticket", "A plant"])
    who = rng.choice(["A group of friends", "The family", "A school club", "Our team"])
    return (f"{thing} costs {cost} {currency}. {who} buys {count} of them. How much do they pay in all?"), count * cost


def more_fewer(rng):
    (name, she, her), (other, _, _), (things, _) = pick_person(rng), pick_person(rng), rng.choice(THINGS)
    a, d = rng.randint(20, 70), rng.randint(3, 15)
    if rng.random() < 0.5:
        return (f"{name} has {a} {things}. {other} has {d} more {things} than {name}. How many {things} "
                f"does {other} have?"), a + d
    return (f"The first class collected {a} {things}. The second class collected {d} fewer than the first. "
            f"How many {things} did the two classes collect together?"), a + a - d


def twice_half(rng):
    (name, she, her), (things, _) = pick_person(rng), rng.choice(THINGS)
    a = rng.randint(6, 40)
    if rng.random() < 0.5:
        return (f"{name} baked {a} {things} last week. This week {she} baked twice as many. How many {things} "
                f"did {she} bake this week?"), 2 * a
    even = 2 * a
    return f"A box holds {even} {things}. Half of them are red. How many {things} are red?", a


def give_half(rng):
    (name, she, her), (things, _) = pick_person(rng), rng.choice(THINGS)
    a = 2 * rng.randint(10, 45)
    return rng.choice([
        f"{name} had {a} {things} and gave half of them to {her} brother. How many {things} does {she} keep?",
        f"The corner shop sold half of its {a} {things} by lunchtime. How many {things} are still for sale?"]), a // 2


def rate(rng):
    thing, verb, unit = rng.choice(ACTIVITIES)
    per, hours = rng.randint(6, 60), rng.randint(2, 9)
    return rng.choice([
        f"{thing} {verb} {per} {unit} every hour. How many {unit} does it manage in {hours} hours?",
        f"In one hour, {thing.lower()} {verb} {per} {unit}. How many {unit} is that after {hours} hours?"]), \
        per * hours


def units(rng):
    big, small, factor = rng.choice(UNITS)
    n = rng.randint(2, 9)
    if big in ("meters", "kilometers"):
        return f"{UNIT_THINGS[big]} is {n} {big} long. How long is it in {small}?", n * factor
    return f"{UNIT_THINGS[big]} lasts {n} {big}. How many {small} is that?", n * factor


def comparison(rng):
    (name, she, her), (other, _, _), (things, _) = pick_person(rng), pick_person(rng), rng.choice(THINGS)
    a = rng.randint(40, 99)
    b = rng.randint(10, a - 3)
    return (f"{name} owns {a} {things} and {other} owns {b}. How many more {things} does {name} own than "
            f"{other}?"), a - b


KINDS = {"addition": addition, "subtraction": subtraction, "multiplication": multiplication, "division": division,
         "two-step": two_step, "three-step": three_step, "money": money, "price": price, "more-fewer": more_fewer,
         "twice-half": twice_half, "give-half": give_half, "rate": rate, "units": units, "comparison": comparison}


def hand_written_questions() -> set[str]:
    """The 20 hand-written questions: the evaluation set, never to be generated."""
    lines = (WEIGHTS / "handwritten_problems.jsonl").read_text().splitlines()
    return {json.loads(line)["messages"][0]["content"] for line in lines if line.strip()}


def everyday_problems(count: int, seed: int) -> list[dict]:
    """`count` distinct problems, the kinds taken in turn, none of them one of the hand-written questions."""
    rng, excluded, seen, problems = random.Random(seed), hand_written_questions(), set(), []
    kinds = list(KINDS)
    while len(problems) < count:
        kind = kinds[len(problems) % len(kinds)]
        question, answer = KINDS[kind](rng)
        if question not in excluded and question not in seen:
            seen.add(question)
            problems.append({"messages": [{"role": "user", "content": question}], "kind": kind, "answer": answer})
    return problems


def original_questions(count: int) -> list[dict]:
    """The first `count` of the demo drafter's training questions: build_corpus.py draws them first, with seed 0."""
    return [{"messages": chat_messages(problem)[:1]} for problem in problems_of_split(count, False, random.Random(0))]


def main(argv=None) -> int:
    parser = OneLineErrors(description="Write word problems in everyday words (the fine-tuning recipe's prompts).")
    parser.add_argument("--count", type=positive_int, default=400, help="problems to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="JSONL file to write")
    parser.add_argument("--replay", action="store_true",
                        help="write the demo drafter's first --count training questions instead (replay data)")

    def write(args) -> int:
        out = Path(args.out)
        if out.exists():
            raise UsageError(f"{out}: exists (remove it, or choose another --out)")
        out.parent.mkdir(parents=True, exist_ok=True)
        problems = original_questions(args.count) if args.replay else everyday_problems(args.count, args.seed)
        out.write_text("".join(json.dumps(problem) + "\n" for problem in problems))
        print(f"{args.count} problems -> {out}")
        return 0

    return run_cli(parser, write, argv)


if __name__ == "__main__":
    raise SystemExit(main())
