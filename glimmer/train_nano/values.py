"""Value pools of the synthetic corpus: the words users put in their requests and tools put in their results.

Every pool is a function of a `random.Random`, so a corpus is a pure function of its seed. Pools mix
common values (real cities, names) with invented words (`made_up_word`), so that the model learns to copy
whatever the user wrote rather than to recall a list.
"""

from __future__ import annotations

import random
from collections.abc import Callable

CITIES = (
    "Paris", "London", "Berlin", "Madrid", "Rome", "Lisbon", "Vienna", "Prague", "Warsaw", "Oslo", "Stockholm",
    "Helsinki", "Copenhagen", "Dublin", "Amsterdam", "Brussels", "Zurich", "Geneva", "Munich", "Hamburg",
    "Milan", "Naples", "Barcelona", "Seville", "Porto", "Athens", "Istanbul", "Cairo", "Nairobi", "Lagos",
    "Accra", "Casablanca", "Tunis", "Johannesburg", "Cape Town", "Dubai", "Doha", "Riyadh", "Tehran", "Karachi",
    "Mumbai", "Delhi", "Bangalore", "Chennai", "Kolkata", "Dhaka", "Kathmandu", "Colombo", "Bangkok", "Hanoi",
    "Singapore", "Kuala Lumpur", "Jakarta", "Manila", "Hong Kong", "Taipei", "Shanghai", "Beijing", "Seoul",
    "Busan", "Tokyo", "Osaka", "Kyoto", "Sydney", "Melbourne", "Perth", "Auckland", "Wellington", "Honolulu",
    "Anchorage", "Vancouver", "Seattle", "Portland", "San Francisco", "Los Angeles", "San Diego", "Phoenix",
    "Denver", "Austin", "Dallas", "Houston", "Chicago", "Detroit", "Toronto", "Montreal", "Boston",
    "New York", "Philadelphia", "Washington", "Atlanta", "Miami", "New Orleans", "Mexico City", "Havana",
    "Bogota", "Lima", "Quito", "Santiago", "Buenos Aires", "Montevideo", "Sao Paulo", "Rio de Janeiro",
    "Reykjavik", "Tallinn", "Riga", "Vilnius", "Krakow", "Budapest", "Bucharest", "Sofia", "Belgrade",
    "Zagreb", "Ljubljana", "Split", "Valencia", "Bilbao", "Lyon", "Marseille", "Nice", "Bordeaux", "Toulouse",
    "Edinburgh", "Glasgow", "Manchester", "Cardiff", "Belfast", "Bergen", "Gothenburg", "Malmo", "Aarhus",
)

FIRST_NAMES = (
    "Ana", "Ben", "Chloe", "Dmitri", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemal", "Lena",
    "Mateo", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tara", "Umar", "Vera", "Wei", "Ximena",
    "Yusuf", "Zoe", "Amara", "Bruno", "Carmen", "Diego", "Emma", "Felix", "Greta", "Hugo", "Ivy", "Jack",
    "Kira", "Liam", "Maya", "Noah", "Olga", "Pablo", "Rania", "Sami", "Tomas", "Uma", "Viktor", "Wanda",
    "Yara", "Zane", "Aiko", "Bilal", "Clara", "Dara", "Eitan", "Fatima", "Gustav", "Hana", "Ivan", "Julia",
)

LAST_NAMES = (
    "Silva", "Novak", "Okafor", "Tanaka", "Schmidt", "Rossi", "Garcia", "Kowalski", "Nguyen", "Haddad",
    "Larsen", "Moreau", "Petrov", "Costa", "Fischer", "Kim", "Singh", "Mensah", "Walsh", "Ortega", "Berg",
    "Duarte", "Ivanova", "Sato", "Lund", "Horvat", "Farouk", "Adeyemi", "Brennan", "Laine",
)

WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")

LANGUAGES = ("French", "Spanish", "German", "Italian", "Portuguese", "Dutch", "Swedish", "Polish", "Turkish",
             "Japanese", "Korean", "Greek", "Finnish", "Czech", "Hindi", "Arabic", "Norwegian", "Danish")

SKIES = ("sunny", "cloudy", "light rain", "heavy rain", "snow", "fog", "clear skies", "thunderstorms",
         "drizzle", "partly cloudy", "windy", "sleet", "hail", "overcast")

CUISINES = ("Italian", "Thai", "Mexican", "Japanese", "Indian", "Lebanese", "Greek", "Korean", "Ethiopian",
            "Vietnamese", "French", "Peruvian", "Turkish", "Spanish", "Chinese", "vegan", "seafood")

TOPICS = ("climate", "elections", "football", "space", "science", "technology", "markets", "health",
          "music", "film", "energy", "education", "travel", "chess", "tennis", "robotics", "farming", "art")

INGREDIENTS = ("chicken", "tofu", "lentils", "salmon", "mushrooms", "spinach", "chickpeas", "eggs", "rice",
               "potatoes", "tomatoes", "beef", "shrimp", "pumpkin", "noodles", "beans", "cheese", "apples")

ROOMS = ("kitchen", "bedroom", "living room", "office", "bathroom", "hallway", "garage", "garden", "attic",
         "dining room", "study", "nursery")

TEAMS = ("Arsenal", "Barcelona", "Celtic", "Benfica", "Ajax", "Juventus", "Lakers", "Celtics", "Warriors",
         "Yankees", "Dodgers", "Bruins", "Rangers", "Porto", "Napoli", "Galatasaray", "Feyenoord", "Lyon")

UNITS_OF_LENGTH = ("km", "miles", "meters", "feet", "inches", "cm", "yards")
CURRENCIES = ("USD", "EUR", "GBP", "JPY", "CHF", "SEK", "NOK", "CAD", "AUD", "INR", "BRL", "MXN")

SHORT_TEXTS = (
    "good morning", "see you tomorrow", "the meeting moved to noon", "thank you for the flowers",
    "where is the station", "I will be late", "happy birthday", "the report is ready", "call me back",
    "lunch is on me", "the train leaves at nine", "please bring the keys", "we won the match",
    "the package arrived", "dinner at eight", "the door is open", "bring an umbrella", "all tests pass",
    "the cat is asleep", "meet me at the bridge", "the shop closes early", "the coffee is cold",
)

NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
                "eleven", "twelve")

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gl", "kr", "pl",
           "st", "tr", "sk", "sn", "th", "ch", "sh", "qu", "w", "y", "h")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou", "ei", "oo", "ia")
_CODAS = ("", "", "", "n", "r", "l", "s", "k", "m", "x", "th", "nd", "st")


def made_up_word(rng: random.Random, syllables: tuple[int, int] = (2, 3)) -> str:
    """A pronounceable invented word, lower case: 'drelvan', 'quoxi'."""
    count = rng.randint(*syllables)
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(count))


def city(rng: random.Random) -> str:
    if rng.random() < 0.15:
        return made_up_word(rng).capitalize() + rng.choice(("", "", "burg", "ville", " Falls", "stad", " Bay"))
    return rng.choice(CITIES)


def person(rng: random.Random) -> str:
    first = made_up_word(rng, (2, 2)).capitalize() if rng.random() < 0.1 else rng.choice(FIRST_NAMES)
    return first if rng.random() < 0.4 else f"{first} {rng.choice(LAST_NAMES)}"


def email(rng: random.Random) -> str:
    user = rng.choice(FIRST_NAMES).lower() + rng.choice(("", ".", "_")) + rng.choice(LAST_NAMES).lower()
    domain = rng.choice(("example.com", "mail.org", "post.net", made_up_word(rng, (1, 2)) + ".io"))
    return f"{user}@{domain}"


def day(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.5:
        return rng.choice(WEEKDAYS)
    if roll < 0.75:
        return f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    return f"{rng.choice(MONTHS)} {rng.randint(1, 28)}"


def clock_time(rng: random.Random) -> str:
    return f"{rng.randint(6, 22):02d}:{rng.choice((0, 15, 30, 45, 5, 10, 20, 40, 50)):02d}"


def ticker(rng: random.Random) -> str:
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    return "".join(rng.choice(letters) for _ in range(rng.randint(2, 4)))


def code(rng: random.Random, prefix: str, digits: int = 4) -> str:
    return f"{prefix}{rng.randint(10 ** (digits - 1), 10**digits - 1)}"


def title(rng: random.Random) -> str:
    """A short title-cased phrase: a song, a movie, a book."""
    words = rng.choice(
        (
            ("The", made_up_word(rng).capitalize()),
            (made_up_word(rng).capitalize(), rng.choice(("Nights", "Road", "River", "Dreams", "Summer", "Lights"))),
            (rng.choice(("Blue", "Silent", "Golden", "Last", "Wild", "Hidden")), rng.choice(("Moon", "Harbor",
                                                                                              "Garden", "Train",
                                                                                              "Letter", "Sky"))),
        )
    )
    return " ".join(words)


def company(rng: random.Random) -> str:
    return made_up_word(rng).capitalize() + rng.choice((" Labs", " Foods", " Motors", "", " Energy", " Bank"))


def short_text(rng: random.Random) -> str:
    if rng.random() < 0.2:
        return " ".join(made_up_word(rng, (1, 2)) for _ in range(rng.randint(2, 4)))
    return rng.choice(SHORT_TEXTS)


def word(rng: random.Random) -> str:
    return made_up_word(rng) if rng.random() < 0.5 else rng.choice(
        ("serendipity", "harbor", "lantern", "quartz", "meadow", "orbit", "velvet", "glacier", "cipher", "ember",
         "tundra", "mosaic", "prism", "canopy", "saddle", "falcon", "nectar", "ripple"))


def file_path(rng: random.Random) -> str:
    folder = rng.choice(("docs", "notes", "src", "data", "reports", "home/" + rng.choice(FIRST_NAMES).lower()))
    return f"{folder}/{made_up_word(rng, (1, 2))}.{rng.choice(('txt', 'md', 'csv', 'json', 'py'))}"


def expression(rng: random.Random) -> str:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    return f"{a} {rng.choice('+-*')} {b}"


def phone(rng: random.Random) -> str:
    return f"+{rng.randint(1, 49)} {rng.randint(100, 999)} {rng.randint(1000, 9999)}"


POOLS: dict[str, Callable[[random.Random], str]] = {
    "city": city,
    "person": person,
    "email": email,
    "day": day,
    "time": clock_time,
    "ticker": ticker,
    "title": title,
    "company": company,
    "text": short_text,
    "word": word,
    "path": file_path,
    "expression": expression,
    "phone": phone,
    "language": lambda rng: rng.choice(LANGUAGES),
    "sky": lambda rng: rng.choice(SKIES),
    "cuisine": lambda rng: rng.choice(CUISINES),
    "topic": lambda rng: rng.choice(TOPICS),
    "ingredient": lambda rng: rng.choice(INGREDIENTS),
    "room": lambda rng: rng.choice(ROOMS),
    "team": lambda rng: rng.choice(TEAMS),
    "currency": lambda rng: rng.choice(CURRENCIES),
    "order_id": lambda rng: code(rng, rng.choice(("A", "B", "ORD-", "#")), 5),
    "tracking": lambda rng: code(rng, rng.choice(("1Z", "JD", "TRK")), 8),
    "flight": lambda rng: f"{rng.choice(('LX', 'BA', 'AF', 'LH', 'KL', 'UA', 'DL', 'QF'))} {rng.randint(10, 999)}",
    "hotel": lambda rng: f"Hotel {made_up_word(rng).capitalize()}",
    "restaurant": lambda rng: f"{rng.choice(('Casa', 'Chez', 'Little', 'The'))} {made_up_word(rng).capitalize()}",
    "headline": lambda rng: f"{made_up_word(rng).capitalize()} {rng.choice(('wins', 'opens', 'plans', 'finds'))} "
                            f"{rng.choice(('new', 'record', 'first', 'big'))} {rng.choice(TOPICS)} deal",
    "status": lambda rng: rng.choice(("in transit", "delivered", "out for delivery", "at the depot", "delayed")),
    "url": lambda rng: f"https://{made_up_word(rng, (1, 2))}.{rng.choice(('com', 'org', 'net', 'io'))}/"
                       f"{made_up_word(rng, (1, 2))}",
    "score": lambda rng: f"{rng.randint(0, 5)}-{rng.randint(0, 5)}",
    "tz": lambda rng: rng.choice(("CET", "UTC", "EST", "PST", "JST", "IST", "GMT", "AEST", "BRT", "EET", "CST")),
    "id": lambda rng: code(rng, rng.choice(("id-", "r-", "t-", "m-", "tx-", "H-")), 4),
}


def number_surface(value: int, rng: random.Random) -> str:
    """How a user writes a small integer: digits, or a word ('three') that the call must turn into 3."""
    if 0 <= value < len(NUMBER_WORDS) and rng.random() < 0.35:
        return NUMBER_WORDS[value]
    return str(value)
