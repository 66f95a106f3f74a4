"""User turns written by the project for the end-of-turn probe (``execstate/agent/end_probe.py``).

A seeded generator of spoken user requests, questions and statements, with its own templates and
vocabulary: none of ``voice_script`` / ``duplex_script``'s sentences or subjects (the voice bench's
turns are the probe's held-out set) and none of the demo's phrases. Each :class:`Turn` is the
whole turn (``words``) and the word boundaries where it is cut for negatives
(``cuts``: the number of words kept), chosen where people pause: after articles, conjunctions,
prepositions, question words, auxiliaries and filler words, and elsewhere less often.

The text is made to look like a recognizer's output: lower case or sentence case (Moonshine's
casing), a comma or period inside sometimes, never a final mark (the agent scores the words
without it), filler words ("um", "uh") now and then, and recognition errors (a word replaced by
a near-sounding one, dropped, or two words run together). Pure Python, deterministic for a seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

OPENERS = ["hey", "so", "okay so", "well", "hi", "hello", "listen", "actually", "right so", "alright",
           "excuse me", "sorry", "one more thing", "oh and", "hmm", "yes", "no", "by the way"]
FILLERS = ["um", "uh", "uhm", "er", "you know", "like", "I mean"]
TAILS = ["please", "for me", "if you can", "right now", "today", "thanks", "I guess", "again",
         "real quick", "when you get a chance", "tonight", "this week", "if that makes sense", "maybe"]

TOPICS = ["volcanoes", "chess", "bicycles", "tax returns", "photosynthesis", "the stock market", "basketball",
          "penguins", "the roman empire", "black holes", "sourdough bread", "electric cars", "tomatoes",
          "spreadsheets", "the french revolution", "honey bees", "solar panels", "the olympics", "dinosaurs",
          "my phone bill", "climate change", "origami", "vitamins", "the piano", "earthquakes", "crossword puzzles",
          "the internet", "octopuses", "skiing", "pizza dough", "the northern lights", "knitting", "wind turbines",
          "yoga", "hiking boots", "the tax deadline", "guitars", "the human brain", "hurricanes", "camping"]
PLACES = ["the pharmacy", "the airport", "the bank", "the library", "the dentist", "the office", "the gym",
          "the post office", "the supermarket", "the museum", "my sister's place", "the hardware store",
          "the train station", "the bakery", "the beach house", "the zoo", "the park", "downtown"]
PEOPLE = ["my mom", "my dad", "my boss", "my neighbor", "my brother", "alex", "sam", "jordan", "my wife",
          "my husband", "my kids", "the landlord", "my doctor", "my coworker", "priya", "the plumber", "grandma"]
ITEMS = ["keys", "wallet", "umbrella", "laptop", "charger", "glasses", "jacket", "passport", "headphones",
         "notebook", "water bottle", "backpack"]
DEVICES = ["lights", "heater", "fan", "tv", "radio", "oven", "dishwasher", "air conditioner", "alarm"]
TIMES = ["tomorrow", "tonight", "at noon", "at seven", "next monday", "on friday", "in the morning",
         "this afternoon", "at half past six", "next week", "in an hour", "after lunch"]
FEELINGS = ["tired", "stressed", "pretty good", "a bit sick", "excited", "bored", "nervous", "happy", "sleepy"]
ADJS = ["best", "easiest", "cheapest", "fastest", "safest", "healthiest", "simplest", "quickest"]
ACTIONS = ["fix a flat tire", "make pancakes", "learn spanish", "clean a cast iron pan", "save money",
           "sleep better", "start running", "write a cover letter", "plant tomatoes", "change a light bulb",
           "cook rice", "get rid of ants", "study for an exam", "fold a fitted sheet", "train a puppy",
           "boil an egg", "paint a room", "unclog a drain", "back up my photos", "stretch my back"]
DOCS = ["an email", "a short poem", "a birthday card", "a thank you note", "a speech", "a shopping list",
        "a text message", "a summary", "a complaint letter", "a toast"]
GENRES = ["jazz", "some rock", "classical", "something relaxing", "podcasts", "the news", "country",
          "something upbeat", "lo-fi beats", "an audiobook"]
NUMBERS = ["two", "three", "four", "five", "six", "ten", "twelve", "fifteen", "twenty", "forty", "a hundred",
           "seven", "eight", "nine", "thirty", "fifty", "15", "25", "64", "120", "3", "8"]

TEMPLATES = [
    "what's the {adj} way to {action}", "how do I {action}", "can you help me {action}",
    "do you know how to {action}", "I need to {action} {time}", "I want to learn how to {action}",
    "explain {topic} to me", "what do you know about {topic}", "why is {topic} so popular",
    "can you explain how {topic} works", "give me {num} facts about {topic}", "I've been reading about {topic}",
    "is it true that {topic} are dangerous", "what's the history of {topic}", "how old is {topic}",
    "remind me to call {person} {time}", "set an alarm for {time}", "set a timer for {num} minutes",
    "turn off the {device}", "turn on the {device} in the kitchen", "can you turn the {device} down a bit",
    "play {genre}", "put on {genre} while I cook", "send a message to {person} saying I'm running late",
    "text {person} that I'll be there {time}", "call {person}", "book a table for {num} {time}",
    "I think I left my {item} at {place}", "where did I put my {item}", "I can't find my {item} anywhere",
    "what time does {place} close", "how far is {place} from here", "is {place} open {time}",
    "I'm going to {place} {time}", "we went to {place} yesterday and it was packed",
    "I'm feeling {feeling} {time}", "I feel {feeling} and I don't know why", "I had a long day at work",
    "help me write {doc} for {person}", "write {doc} about {topic}", "can you draft {doc} to {person}",
    "what's {num} plus {num2}", "what is {num} minus {num2}", "how much is {num} divided by {num2}",
    "add {num} and {num2} together", "convert {num} miles to kilometers", "how many cups are in a liter",
    "what's the weather like {time}", "will it snow {time}", "do I need an umbrella {time}",
    "my {device} stopped working again", "the {device} is making a weird noise",
    "{person} wants to know if we can meet {time}", "{person} said the meeting moved to {time2}",
    "I can't decide between {topic} and {topic2}", "which is better {topic} or {topic2}",
    "recommend a good book about {topic}", "any tips for {action2}", "what should I cook for dinner",
    "what should I get {person} for their birthday", "how do you say thank you in italian",
    "spell the word necessary", "what does the word ubiquitous mean", "tell {person} I said hi",
    "I don't think that's right", "that's not what I asked", "can you say that again", "never mind",
    "that sounds great", "no that's fine", "thanks that helps a lot", "I have another question",
    "let's talk about {topic}", "I'm planning a trip to see {person} {time}",
    "are there any good restaurants near {place}", "how long does it take to {action}",
    "is it okay to {action} {time}", "what happens if I don't {action}",
]
# words after which people pause mid-sentence (cut there most often)
PAUSE_AFTER = {"the", "a", "an", "and", "about", "what", "is", "to", "of", "for", "my", "with", "um", "uh",
               "uhm", "er", "but", "so", "because", "if", "that", "I", "you", "how", "do", "can", "in", "at",
               "on", "some", "this", "like", "mean", "know", "it's", "what's", "where", "when", "why", "which",
               "or", "was", "are", "want", "need", "think", "me", "your", "our", "their", "from", "by", "then"}
# near-sounding replacements (recognition errors)
CONFUSIONS = {"for": "four", "to": "two", "write": "right", "there": "their", "know": "no", "hear": "here",
              "buy": "by", "weather": "whether", "one": "won", "our": "are", "I'll": "aisle",
              "meet": "meat", "week": "weak", "would": "wood", "new": "knew", "made": "maid", "hour": "our",
              "tire": "tired", "cook": "look", "call": "cool", "message": "massage", "light": "like",
              "timer": "time her", "alarm": "a lot", "bill": "build", "bread": "bed", "minutes": "minute"}


@dataclass(frozen=True)
class Turn:
    words: tuple[str, ...]  # the whole turn as the recognizer would write it (no final mark)
    cuts: tuple[int, ...]  # word counts kept for the negatives (each < len(words))


def _fill(rng: random.Random, template: str) -> str:
    topic, topic2 = rng.sample(TOPICS, 2)
    num, num2 = rng.choice(NUMBERS), rng.choice(NUMBERS)
    action, action2 = rng.sample(ACTIONS, 2)
    return template.format(adj=rng.choice(ADJS), action=action, action2="how to " + action2, time=rng.choice(TIMES),
                           time2=rng.choice(["noon", "seven", "friday", "next week", "the afternoon", "monday"]),
                           topic=topic, topic2=topic2, num=num, num2=num2, person=rng.choice(PEOPLE),
                           device=rng.choice(DEVICES), genre=rng.choice(GENRES), item=rng.choice(ITEMS),
                           place=rng.choice(PLACES), feeling=rng.choice(FEELINGS), doc=rng.choice(DOCS))


def _sentence(rng: random.Random) -> list[str]:
    words: list[str] = []
    if rng.random() < 0.3:
        words += rng.choice(OPENERS).split()
    words += _fill(rng, rng.choice(TEMPLATES)).split()
    if rng.random() < 0.2:  # a second clause
        words += [rng.choice(["and", "but", "because", "so", "and then", "or maybe"])]
        words[-1:] = words[-1].split()
        words += _fill(rng, rng.choice(TEMPLATES)).split()
    if rng.random() < 0.25:
        words += rng.choice(TAILS).split()
    return words


def _noisy(rng: random.Random, words: list[str]) -> list[str]:
    """Fillers inside, recognition errors."""
    out: list[str] = []
    for i, w in enumerate(words):
        if i > 0 and rng.random() < 0.04:
            out += rng.choice(FILLERS).split()
        r = rng.random()
        if r < 0.04 and w in CONFUSIONS:
            out += CONFUSIONS[w].split()
        elif r < 0.06 and len(words) > 3:
            continue  # dropped
        elif r < 0.075 and out:
            out[-1] = out[-1] + w  # run together
        else:
            out.append(w)
    return out or words


def _cased(rng: random.Random, words: list[str]) -> list[str]:
    """Lower case (40 %) or Moonshine's sentence case, sometimes with a comma or period inside."""
    if rng.random() < 0.4:
        return [w.lower() for w in words]
    out = list(words)
    out[0] = out[0][:1].upper() + out[0][1:]
    for i in range(len(out) - 1):
        r = rng.random()
        if out[i].lower() in {"hey", "so", "okay", "well", "hi", "hello", "listen", "actually", "alright",
                              "sorry", "yes", "no", "hmm", "um", "uh"} and r < 0.5:
            out[i] += rng.choice([",", ",", "."])
            if out[i].endswith("."):
                out[i + 1] = out[i + 1][:1].upper() + out[i + 1][1:]
        elif r < 0.03:
            out[i] += ","
    return [w if w != "i" else "I" for w in out]


def _cuts(rng: random.Random, words: list[str]) -> tuple[int, ...]:
    """Up to three cut points: after a pause word (weight 4) or any other word (weight 1)."""
    n = len(words)
    if n < 2:
        return ()
    points = list(range(1, n))
    weights = [4.0 if words[k - 1].lower().strip(",.") in PAUSE_AFTER else 1.0 for k in points]
    picked: set[int] = set()
    for _ in range(min(3, len(points))):
        picked.add(rng.choices(points, weights)[0])
    return tuple(sorted(picked))


def generate(n: int, seed: int) -> list[Turn]:
    """``n`` user turns (deterministic for ``seed``); a filler at a cut is kept in the negative
    ("I need to um"), as a recognizer writes it."""
    rng = random.Random(seed)
    turns: list[Turn] = []
    while len(turns) < n:
        words = _cased(rng, _noisy(rng, _sentence(rng)))
        cuts = _cuts(rng, words)
        if cuts and rng.random() < 0.3:  # a filler where the user pauses: "... about um"
            k = rng.choice(cuts)
            words = [*words[:k], rng.choice(["um", "uh", "uhm", "er"]), *words[k:]]
            cuts = tuple(c + (c > k) for c in cuts if c != k) + (k + 1,)
            cuts = tuple(sorted(set(cuts)))
        turns.append(Turn(tuple(w.rstrip(".,") if i == len(words) - 1 else w for i, w in enumerate(words)),
                          cuts))
    return turns


def examples(turns: list[Turn]) -> list[tuple[str, int]]:
    """(text, label): each whole turn (1) and each of its cuts (0), the cut's last mark removed."""
    out: list[tuple[str, int]] = []
    for t in turns:
        out.append((" ".join(t.words), 1))
        for k in t.cuts:
            out.append((" ".join(t.words[:k]).rstrip(".,"), 0))
    return out
