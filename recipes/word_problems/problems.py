"""Grade-school word problems with step-by-step answers, written by a program.

The demo target learns to solve these, so the generator is its whole world. A problem
is a few sentences about an agent (a child, a baker, a class, a shop, ...), its
objects and some numbers; the answer reasons in explicit arithmetic (`3 * 6 = 18`)
and ends with `The answer is N.` That text mixes formulaic reasoning, which a drafter
can guess from the question, with computed numbers, which it often cannot: the
pattern DFlash's per-slot acceptance teaches.

Variety is what lets a small model generalise to problems written in other words:
every kind has several sentence templates, verbs and questions are drawn from
synonym lists, agents and objects from broad lists, and some problems carry an
irrelevant sentence. The numbers stay in ranges a tiny model can compute.

`make_problem(rng)` draws one problem; `Problem.answer` is the number it must reach.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# --------------------------------------------------------------------------- the world


@dataclass(frozen=True)
class Agent:
    subject: str  # starts a sentence: "Mia", "The baker"
    pronoun: str  # "she", "he", "it"
    possessive: str  # "her", "his", "its"

    @property
    def ref(self) -> str:
        """The agent in mid-sentence: "Mia", "the baker"."""
        if " " not in self.subject:
            return self.subject
        return "the " + self.subject.split(" ", 1)[1]


FIRST_NAMES = [
    ("Mia", "she"), ("Leo", "he"), ("Ava", "she"), ("Noah", "he"), ("Zoe", "she"), ("Omar", "he"),
    ("Lena", "she"), ("Ravi", "he"), ("Sofia", "she"), ("Ben", "he"), ("Nora", "she"), ("Sam", "he"),
    ("Ella", "she"), ("Jack", "he"), ("Aisha", "she"), ("Tom", "he"), ("Lucy", "she"), ("Ivan", "he"),
    ("Maya", "she"), ("Liam", "he"), ("Hana", "she"), ("Carlos", "he"), ("Emma", "she"), ("Kofi", "he"),
    ("Grace", "she"), ("Yuki", "she"), ("Max", "he"), ("Rosa", "she"), ("Eli", "he"), ("Anna", "she"),
    ("Finn", "he"), ("Priya", "she"), ("Owen", "he"), ("Chloe", "she"), ("Amir", "he"), ("Ruby", "she"),
    ("Diego", "he"), ("Ivy", "she"), ("Jonas", "he"), ("Layla", "she"), ("Hugo", "he"), ("Nina", "she"),
]
GROUPS = [  # agents that are not a person's name; "it" for places, he/she for people by role
    ("The baker", "she"), ("A farmer", "he"), ("The teacher", "she"), ("A gardener", "he"),
    ("The class", "it"), ("A shop", "it"), ("The library", "it"), ("A school", "it"),
    ("The cafe", "it"), ("A toy store", "it"), ("The club", "it"), ("A zoo keeper", "he"),
]
POSSESSIVES = {"she": "her", "he": "his", "it": "its"}

OBJECTS = [  # plural, singular
    ("apples", "apple"), ("oranges", "orange"), ("pears", "pear"), ("lemons", "lemon"), ("plums", "plum"),
    ("pencils", "pencil"), ("crayons", "crayon"), ("stickers", "sticker"), ("stamps", "stamp"),
    ("marbles", "marble"), ("cards", "card"), ("books", "book"), ("notebooks", "notebook"),
    ("cookies", "cookie"), ("muffins", "muffin"), ("cupcakes", "cupcake"), ("eggs", "egg"),
    ("balloons", "balloon"), ("beads", "bead"), ("shells", "shell"), ("buttons", "button"),
    ("flowers", "flower"), ("toy cars", "toy car"), ("candles", "candle"), ("ribbons", "ribbon"),
    ("carrots", "carrot"), ("tomatoes", "tomato"), ("bottles", "bottle"), ("cups", "cup"),
    ("coins", "coin"), ("puzzles", "puzzle"), ("kites", "kite"), ("boxes of tea", "box of tea"),
]
CONTAINERS = ["boxes", "bags", "baskets", "jars", "packs", "crates", "trays", "rows", "shelves"]
PEOPLE = ["friends", "students", "children", "classmates", "neighbors", "players", "guests", "cousins"]
GAIN_VERBS = ["buys", "gets", "finds", "receives", "collects", "is given", "picks up", "adds"]
LOSE_VERBS = ["gives away", "loses", "sells", "uses", "gives", "donates", "hands out"]
PRICED_ITEMS = ["notebooks", "pens", "sandwiches", "tickets", "comic books", "toy cars", "bowls",
                "mugs", "scarves", "plants", "pies", "bracelets", "posters", "juice boxes"]
CURRENCIES = ["dollars", "euros", "coins"]
DISTRACTORS = [
    "It is a sunny day.", "The weather is cold today.", "{S} likes the color blue.",
    "{S} has {n} cats at home.", "The store opens at {n} o'clock.", "{S} is {n} years old.",
    "It is a Monday.", "{S} lives near a park.", "The room has {n} windows.",
]
RATE_ACTIONS = [  # (what is done, unit of work, per what)
    ("A printer prints", "pages", "minute"), ("A machine makes", "toys", "hour"),
    ("A baker bakes", "loaves", "hour"), ("A pump fills", "buckets", "minute"),
    ("A worker packs", "boxes", "hour"), ("A bee visits", "flowers", "minute"),
    ("A factory builds", "chairs", "day"), ("A farmer plants", "trees", "day"),
]
SPEEDS = [("A car", "kilometers", "hour"), ("A train", "kilometers", "hour"),
          ("A cyclist", "miles", "hour"), ("A runner", "meters", "minute"), ("A boat", "miles", "hour")]
UNITS = [  # (bigger, smaller, how many smaller in one bigger, a sentence with {x} of the bigger)
    ("meters", "centimeters", 100, "A rope is {x} meters long."),
    ("hours", "minutes", 60, "A trip takes {x} hours."),
    ("minutes", "seconds", 60, "A song lasts {x} minutes."),
    ("dozen", "eggs", 12, "A farmer packs {x} dozen eggs."),
    ("weeks", "days", 7, "A holiday lasts {x} weeks."),
    ("kilograms", "grams", 1000, "A bag of rice weighs {x} kilograms."),
    ("feet", "inches", 12, "A board is {x} feet long."),
    ("days", "hours", 24, "A camp lasts {x} days."),
    ("yards", "feet", 3, "A garden is {x} yards wide."),
    ("liters", "milliliters", 1000, "A jug holds {x} liters of water."),
]


class World:
    """The random choices a problem draws, from one seeded generator."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def pick(self, options):
        return self.rng.choice(options)

    def num(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)

    def agent(self, person_only: bool = False) -> Agent:
        if person_only or self.rng.random() < 0.7:
            name, pronoun = self.pick(FIRST_NAMES)
        else:
            name, pronoun = self.pick(GROUPS)
        return Agent(name, pronoun, POSSESSIVES[pronoun])

    def two_people(self) -> tuple[Agent, Agent]:
        first, second = self.rng.sample(FIRST_NAMES, 2)
        return tuple(Agent(n, p, POSSESSIVES[p]) for n, p in (first, second))

    def thing(self) -> tuple[str, str]:
        return self.pick(OBJECTS)

    def maybe_distractor(self, agent: Agent) -> list[str]:
        """One irrelevant sentence about a tenth of the time."""
        if self.rng.random() > 0.1:
            return []
        return [self.pick(DISTRACTORS).format(S=agent.subject, n=self.num(2, 9))]


def cap(text: str) -> str:
    return text[0].upper() + text[1:]


@dataclass
class Problem:
    kind: str
    question: str
    solution: str  # the step-by-step reasoning, ending with "The answer is N."
    answer: int


def finish(kind: str, world: World, sentences: list[str], question: str, steps: list[str], answer: int) -> Problem:
    """Join the story (in order, an irrelevant sentence maybe inserted) and the reasoning."""
    if world.rng.random() < 0.1 and len(sentences) > 1:  # now and then the question comes first
        text = cap(question) + " " + " ".join(sentences)
    else:
        text = " ".join(sentences) + " " + cap(question)
    return Problem(kind, text, " ".join(steps + [f"The answer is {answer}."]), answer)


def with_distractor(world: World, agent: Agent, sentences: list[str]) -> list[str]:
    extra = world.maybe_distractor(agent)
    if extra:
        sentences = sentences[:1] + extra + sentences[1:]
    return sentences


# --------------------------------------------------------------------------- the kinds


def addition(w: World) -> Problem:
    a, (things, _) = w.agent(), w.thing()
    x, y = w.num(2, 99), w.num(2, 99)
    verb = w.pick(GAIN_VERBS)
    story = w.pick([
        [f"{a.subject} has {x} {things}.", f"{cap(a.pronoun)} {verb} {y} more."],
        [f"{a.subject} had {x} {things}.", f"Then {a.pronoun} {verb} {y} more {things}."],
        [f"There are {x} {things} in a box.", f"{a.subject} puts {y} more {things} in the box."],
        [f"On Monday {a.ref} collects {x} {things}.", f"On Tuesday {a.pronoun} collects {y} {things}."],
    ])
    question = w.pick([f"how many {things} are there now?", f"how many {things} are there in all?",
                       f"what is the total number of {things}?", f"how many {things} altogether?"])
    steps = [f"We add the two amounts: {x} + {y} = {x + y}."]
    return finish("addition", w, with_distractor(w, a, story), question, steps, x + y)


def subtraction(w: World) -> Problem:
    a, (things, _) = w.agent(), w.thing()
    x = w.num(10, 99)
    y = w.num(1, x - 1)
    verb = w.pick(LOSE_VERBS)
    story = w.pick([
        [f"{a.subject} has {x} {things}.", f"{cap(a.pronoun)} {verb} {y} of them."],
        [f"{a.subject} had {x} {things}.", f"{cap(a.pronoun)} {verb} {y} {things}."],
        [f"There were {x} {things} on the table.", f"{a.subject} took {y} {things} away."],
        [f"{a.subject} started the day with {x} {things} and {verb} {y}."],
    ])
    question = w.pick([f"how many {things} are left?", f"how many {things} remain?",
                       f"how many {things} does {a.ref} have left?", f"how many {things} are there now?"])
    steps = [f"We take away what is gone: {x} - {y} = {x - y}."]
    return finish("subtraction", w, with_distractor(w, a, story), question, steps, x - y)


def multiplication(w: World) -> Problem:
    a, (things, _) = w.agent(), w.thing()
    n, m = w.num(2, 9), w.num(2, 25)
    box = w.pick(CONTAINERS)
    story = w.pick([
        [f"{a.subject} has {n} {box}.", f"Each of the {box} holds {m} {things}."],
        [f"{a.subject} has {n} {box} with {m} {things} in each."],
        [f"There are {m} {things} in every one of the {box}.", f"{a.subject} fills {n} {box}."],
    ])
    question = w.pick([f"how many {things} are there in all?", f"how many {things} does {a.ref} have?",
                       f"what is the total number of {things}?"])
    steps = [f"There are {n} groups of {m}: {n} * {m} = {n * m}."]
    return finish("multiplication", w, with_distractor(w, a, story), question, steps, n * m)


def division(w: World) -> Problem:
    a, (things, _) = w.agent(), w.thing()
    n, each = w.num(2, 9), w.num(2, 15)
    total = n * each
    people = w.pick(PEOPLE)
    story = w.pick([
        [f"{a.subject} has {total} {things}.", f"{cap(a.pronoun)} shares them equally among {n} {people}."],
        [f"{a.subject} splits {total} {things} evenly between {n} {people}."],
        [f"{total} {things} are packed into {n} bags with the same number in each bag."],
    ])
    question = (f"how many {things} are in each bag?" if "bags" in story[-1]
                else w.pick([f"how many {things} does each of the {people} get?",
                             f"how many {things} does each one get?"]))
    steps = [f"We share {total} into {n} equal parts: {total} / {n} = {each}."]
    return finish("division", w, with_distractor(w, a, story), question, steps, each)


def two_step(w: World) -> Problem:
    a, (things, _) = w.agent(), w.thing()
    x, y = w.num(5, 60), w.num(2, 40)
    z = w.num(1, x + y - 1)
    gain, lose = w.pick(GAIN_VERBS), w.pick(LOSE_VERBS)
    story = w.pick([
        [f"{a.subject} has {x} {things}.", f"{cap(a.pronoun)} {gain} {y} more.", f"Then {a.pronoun} {lose} {z}."],
        [f"{a.subject} had {x} {things}, {gain} {y} more, and later {lose} {z} of them."],
        [f"In the morning {a.ref} has {x} {things}.", f"At noon {a.pronoun} {gain} {y} more {things}.",
         f"In the evening {a.pronoun} {lose} {z} {things}."],
    ])
    question = w.pick([f"how many {things} does {a.ref} have now?", f"how many {things} are left?",
                       f"how many {things} does {a.ref} have at the end?"])
    steps = [f"First {x} + {y} = {x + y}.", f"Then {x + y} - {z} = {x + y - z}."]
    return finish("two-step", w, with_distractor(w, a, story), question, steps, x + y - z)


def three_step(w: World) -> Problem:
    a, (things, _) = w.agent(), w.thing()
    n, m = w.num(2, 9), w.num(2, 12)
    z = w.num(1, n * m - 1)
    extra = w.num(2, 30)
    box, lose, gain = w.pick(CONTAINERS), w.pick(LOSE_VERBS), w.pick(GAIN_VERBS)
    story = w.pick([
        [f"{a.subject} has {n} {box} of {things} with {m} in each.", f"{cap(a.pronoun)} {lose} {z} {things}.",
         f"Then {a.pronoun} {gain} {extra} more."],
        [f"There are {n} {box} with {m} {things} in each.", f"{a.subject} {lose} {z} of the {things}",
         f"and then {gain} {extra} more."],
    ])
    if story[-1].startswith("and"):
        story = [story[0], story[1] + " " + story[2]]
    question = w.pick([f"how many {things} does {a.ref} have now?", f"how many {things} are there now?"])
    steps = [f"First {n} * {m} = {n * m}.", f"Then {n * m} - {z} = {n * m - z}.",
             f"Then {n * m - z} + {extra} = {n * m - z + extra}."]
    return finish("three-step", w, with_distractor(w, a, story), question, steps, n * m - z + extra)


def money_change(w: World) -> Problem:
    a = w.agent(person_only=True)
    item, money = w.pick(PRICED_ITEMS), w.pick(CURRENCIES)
    n = w.num(2, 9)
    price = w.num(2, min(12, 100 // n))
    cost = n * price
    paid = w.pick([b for b in (10, 20, 50, 100) if b >= cost])
    story = w.pick([
        [f"{a.subject} buys {n} {item} that cost {price} {money} each.",
         f"{cap(a.pronoun)} pays with {paid} {money}."],
        [f"{cap(item)} cost {price} {money} each.", f"{a.subject} buys {n} of them and pays with {paid} {money}."],
        [f"{a.subject} has {paid} {money}.", f"{cap(a.pronoun)} spends it on {n} {item} at {price} {money} each."],
    ])
    question = w.pick([f"how much change does {a.ref} get?", f"how many {money} does {a.ref} get back?",
                       f"how many {money} are left?"])
    steps = [f"The {item} cost {n} * {price} = {cost}.", f"The change is {paid} - {cost} = {paid - cost}."]
    return finish("money", w, with_distractor(w, a, story), question, steps, paid - cost)


def total_cost(w: World) -> Problem:
    a = w.agent(person_only=True)
    item, money = w.pick(PRICED_ITEMS), w.pick(CURRENCIES)
    n, price = w.num(2, 9), w.num(2, 30)
    story = w.pick([
        [f"One of the {item} costs {price} {money}.", f"{a.subject} wants to buy {n} of them."],
        [f"{a.subject} buys {n} {item} at {price} {money} each."],
        [f"At the market, {item} are {price} {money} each.", f"{a.subject} takes {n}."],
    ])
    question = w.pick([f"how much does {a.ref} pay?", f"how many {money} does {a.ref} spend?",
                       f"what is the total cost in {money}?"])
    steps = [f"{n} {item} at {price} each cost {n} * {price} = {n * price}."]
    return finish("price", w, with_distractor(w, a, story), question, steps, n * price)


def more_or_fewer(w: World) -> Problem:
    a, b = w.two_people()
    things, _ = w.thing()
    x, d = w.num(10, 80), w.num(2, 9)
    more = w.rng.random() < 0.5
    y = x + d if more else x - d
    word = "more" if more else "fewer"
    together = w.rng.random() < 0.4
    story = w.pick([
        [f"{a.subject} has {x} {things}.", f"{b.subject} has {d} {word} {things} than {a.ref}."],
        [f"{b.subject} has {d} {word} {things} than {a.ref}.", f"{a.subject} has {x} {things}."],
    ])
    sign = "+" if more else "-"
    steps = [f"{b.subject} has {x} {sign} {d} = {y}."]
    if together:
        question = w.pick([f"how many {things} do they have together?", f"how many {things} do they have in all?"])
        steps.append(f"Together they have {x} + {y} = {x + y}.")
        answer = x + y
    else:
        question = f"how many {things} does {b.ref} have?"
        answer = y
    return finish("more-fewer", w, story, question, steps, answer)


def twice_or_half(w: World) -> Problem:
    a, b = w.two_people()
    things, _ = w.thing()
    if w.rng.random() < 0.5:
        x = w.num(2, 45)
        story = [f"{a.subject} has {x} {things}.",
                 w.pick([f"{b.subject} has twice as many {things} as {a.ref}.",
                         f"{b.subject} has two times as many {things}.",
                         f"{b.subject} has double the number of {things} {a.ref} has."])]
        steps = [f"Twice {x} is {x} * 2 = {x * 2}."]
        y = x * 2
    else:
        x = 2 * w.num(2, 45)
        story = [f"{a.subject} has {x} {things}.",
                 w.pick([f"{b.subject} has half as many {things} as {a.ref}.",
                         f"{b.subject} has half the number of {things} {a.ref} has."])]
        steps = [f"Half of {x} is {x} / 2 = {x // 2}."]
        y = x // 2
    if w.rng.random() < 0.4:
        question = f"how many {things} do {a.ref} and {b.ref} have together?"
        steps.append(f"Together {x} + {y} = {x + y}.")
        return finish("twice-half", w, story, question, steps, x + y)
    return finish("twice-half", w, story, f"how many {things} does {b.ref} have?", steps, y)


def give_half(w: World) -> Problem:
    a, (things, _) = w.agent(), w.thing()
    x = 2 * w.num(3, 45)
    story = [f"{a.subject} has {x} {things}.",
             w.pick([f"{cap(a.pronoun)} gives half of them to a friend.", f"{cap(a.pronoun)} sells half of them.",
                     f"{cap(a.pronoun)} uses half of {a.possessive} {things}."])]
    question = w.pick([f"how many {things} are left?", f"how many {things} does {a.ref} keep?"])
    steps = [f"Half of {x} is {x} / 2 = {x // 2}.", f"{x} - {x // 2} = {x - x // 2}."]
    return finish("give-half", w, with_distractor(w, a, story), question, steps, x - x // 2)


def rate(w: World) -> Problem:
    if w.rng.random() < 0.5:
        doer, work, per = w.pick(RATE_ACTIONS)
        r, t = w.num(2, 30), w.num(2, 9)
        story = [w.pick([f"{doer} {r} {work} every {per}.", f"{doer} {r} {work} each {per}.",
                         f"{doer} {r} {work} per {per}."])]
        question = w.pick([f"how many {work} are done in {t} {per}s?", f"how many {work} after {t} {per}s?"])
        steps = [f"In {t} {per}s: {r} * {t} = {r * t}."]
        return finish("rate", w, story, question, steps, r * t)
    mover, unit, per = w.pick(SPEEDS)
    r, t = w.num(3, 60), w.num(2, 9)
    story = [w.pick([f"{mover} travels {r} {unit} every {per}.", f"{mover} goes {r} {unit} in one {per}.",
                     f"{mover} moves at {r} {unit} per {per}."])]
    question = w.pick([f"how many {unit} does it travel in {t} {per}s?", f"how far does it go in {t} {per}s?"])
    steps = [f"In {t} {per}s it goes {r} * {t} = {r * t} {unit}."]
    return finish("rate", w, story, question, steps, r * t)


def units(w: World) -> Problem:
    big, small, factor, sentence = w.pick(UNITS)
    x = w.num(2, 9)
    story = [sentence.format(x=x)]
    one = {"feet": "foot", "dozen": "dozen"}.get(big, big.removesuffix("s"))
    steps = [f"One {one} is {factor} {small}, so {x} * {factor} = {x * factor}."]
    if w.rng.random() < 0.35 and factor <= 100:
        y = w.num(1, factor - 1)
        story = [story[0].replace(f"{x} {big}", f"{x} {big} and {y} {small}")]
        steps.append(f"Then {x * factor} + {y} = {x * factor + y}.")
        return finish("units", w, story, f"how many {small} is that in all?", steps, x * factor + y)
    question = w.pick([f"how many {small} is that?", f"how many {small} are in {x} {big}?"])
    return finish("units", w, story, question, steps, x * factor)


def comparison(w: World) -> Problem:
    a, b = w.two_people()
    things, _ = w.thing()
    x = w.num(10, 99)
    y = w.num(2, x - 1)
    story = w.pick([[f"{a.subject} has {x} {things} and {b.ref} has {y} {things}."],
                    [f"{a.subject} has {x} {things}.", f"{b.subject} has {y} {things}."],
                    [f"{b.subject} owns {y} {things}, while {a.ref} owns {x}."]])
    question = w.pick([f"how many more {things} does {a.ref} have than {b.ref}?",
                       f"how many fewer {things} does {b.ref} have than {a.ref}?",
                       f"what is the difference between their numbers of {things}?"])
    steps = [f"The difference is {x} - {y} = {x - y}."]
    return finish("comparison", w, story, question, steps, x - y)


KINDS = {
    "addition": addition, "subtraction": subtraction, "multiplication": multiplication, "division": division,
    "two-step": two_step, "three-step": three_step, "money": money_change, "price": total_cost,
    "more-fewer": more_or_fewer, "twice-half": twice_or_half, "give-half": give_half, "rate": rate,
    "units": units, "comparison": comparison,
}


def make_problem(rng: random.Random) -> Problem:
    """One problem of a kind drawn uniformly."""
    kind = rng.choice(list(KINDS))
    return KINDS[kind](World(rng))


def chat_messages(problem: Problem) -> list[dict]:
    """The problem as a one-turn conversation, answered: what the target trains on."""
    return [{"role": "user", "content": problem.question}, {"role": "assistant", "content": problem.solution}]
