"""The tool domains of the synthetic corpus: what a tool does, how a user asks for it, what it returns.

A domain is data: description variants, the parameters (slots) with their JSON types and the name
variants a tool may give them, request templates in which the user states the arguments, the result
fields, and answer templates that use them. Tool *names* are not part of a domain: `names.py` draws them,
so the model must pick a tool by its description and copy whatever name it was declared with.

Templates use `{slot}` for a slot's surface form (what the user wrote), `{r0}`, `{r1}`, … for the result
fields in order. Optional slots are asked for by a clause appended to the request.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Slot:
    """One parameter. kind: string | integer | number | boolean | enum | array (of strings).

    pool: value pool name (values.POOLS) for string and array slots; span: (low, high) for numbers;
    choices: enum values, or for a boolean the two surface words for (true, false).
    """

    id: str
    kind: str
    description: str
    keys: tuple[str, ...]
    pool: str = ""
    span: tuple[float, float] = (1, 10)
    choices: tuple[str, ...] = ()
    required: bool = True
    clauses: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("string", "integer", "number", "boolean", "enum", "array"):
            raise ValueError(f"slot {self.id}: unknown kind {self.kind!r}")
        if not self.required and not self.clauses:
            raise ValueError(f"slot {self.id}: an optional slot needs clauses that ask for it")


@dataclass(frozen=True)
class ResultField:
    """One field of a tool result: keys are its name variants; pool/span/choices as for slots, or `copy`, the
    id of a slot whose surface form the tool echoes."""

    keys: tuple[str, ...]
    kind: str = "string"
    pool: str = ""
    span: tuple[float, float] = (0, 100)
    copy: str = ""
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Domain:
    key: str
    ability: str
    descriptions: tuple[str, ...]
    stems: tuple[str, ...]
    namespaces: tuple[str, ...]
    verbs: tuple[str, ...]
    slots: tuple[Slot, ...]
    requests: tuple[str, ...]
    intent: str
    result: tuple[ResultField, ...]
    answers: tuple[str, ...]
    pair_requests: tuple[str, ...] = ()


def _s(id: str, kind: str, description: str, keys: tuple[str, ...] = (), **options) -> Slot:
    return Slot(id=id, kind=kind, description=description, keys=keys or (id,), **options)


def _r(*keys: str, **options) -> ResultField:
    return ResultField(keys=keys, **options)


CITY = ("city", "location", "city_name", "place")

DOMAINS: tuple[Domain, ...] = (
    Domain(
        key="weather", ability="check the weather",
        descriptions=("Get the current weather for a city.", "Look up the weather right now in a place.",
                      "Current weather conditions and temperature for a location."),
        stems=("get_weather", "get_current_weather", "current_weather", "weather_now", "check_weather", "weather",
               "lookup_weather"),
        namespaces=("weather", "meteo", "sky", "climate"), verbs=("current", "now", "get", "lookup", "conditions"),
        slots=(_s("city", "string", "The city name.", CITY, pool="city"),
               _s("unit", "enum", "Temperature unit.", ("unit", "units", "scale"), choices=("celsius", "fahrenheit"),
                  required=False, clauses=(" Give it in {unit}.", " Use {unit}, please.", " ({unit})"))),
        requests=("What's the weather in {city}?", "How is the weather in {city} right now?",
                  "Is it warm in {city} today?", "weather {city}", "Tell me the current weather in {city}.",
                  "Can you check the weather for {city}?"),
        intent="the weather in {city}",
        result=(_r("temperature", "temp", "temperature_c", kind="integer", span=(-15, 38)),
                _r("conditions", "sky", "summary", pool="sky")),
        answers=("It is {r0} degrees with {r1} in {city}.", "In {city} it's {r0} degrees right now, {r1}.",
                 "Right now {city} has {r1} and {r0} degrees."),
        pair_requests=("What's the weather in {a} and in {b}?", "Compare the weather in {a} and {b}."),
    ),
    Domain(
        key="forecast", ability="give weather forecasts",
        descriptions=("Get the weather forecast for the coming days in a city.", "Multi-day forecast for a place."),
        stems=("get_forecast", "forecast", "weather_forecast", "daily_forecast"),
        namespaces=("weather", "forecast", "meteo"), verbs=("forecast", "daily", "outlook"),
        slots=(_s("city", "string", "The city.", CITY, pool="city"),
               _s("days", "integer", "How many days to forecast.", ("days", "num_days", "horizon"), span=(1, 10),
                  required=False, clauses=(" For the next {days} days.", " I need {days} days.",
                                           " Cover {days} days."))),
        requests=("What's the forecast for {city}?", "Will it rain in {city} this week?",
                  "Give me the weather forecast for {city}.", "forecast for {city} please"),
        intent="the forecast for {city}",
        result=(_r("high", "max_temp", kind="integer", span=(0, 40)), _r("low", "min_temp", kind="integer",
                                                                          span=(-15, 20)),
                _r("outlook", "summary", pool="sky")),
        answers=("The forecast for {city}: highs of {r0}, lows of {r1}, mostly {r2}.",
                 "{city} will see {r2}, with a high of {r0} and a low of {r1}."),
    ),
    Domain(
        key="calendar", ability="look at your calendar",
        descriptions=("List the events in the user's calendar on a given day.", "Look up calendar events for a day."),
        stems=("calendar_lookup", "list_events", "get_events", "agenda"),
        namespaces=("calendar", "cal", "agenda", "schedule"), verbs=("lookup", "events", "list", "day"),
        slots=(_s("day", "string", "The day, as a weekday or a date.", ("day", "date", "when"), pool="day"),
               _s("limit", "integer", "Maximum number of events.", ("limit", "max_events", "count"), span=(1, 10),
                  required=False, clauses=(" Only the first {limit}.", " Show at most {limit} events."))),
        requests=("What's on my calendar on {day}?", "Do I have meetings on {day}?", "Show my events for {day}.",
                  "agenda for {day}", "What does {day} look like for me?"),
        intent="the events on {day}",
        result=(_r("count", "events", "total", kind="integer", span=(0, 9)), _r("first", "next_event", pool="title"),
                _r("starts", "start_time", pool="time")),
        answers=("You have {r0} events on {day}; the first is {r1} at {r2}.",
                 "On {day} there are {r0} events, starting with {r1} at {r2}."),
    ),
    Domain(
        key="email", ability="send emails",
        descriptions=("Send an email to one recipient.", "Compose and send an email message."),
        stems=("send_email", "email_send", "mail", "compose_email"),
        namespaces=("email", "mail", "inbox", "outbox"), verbs=("send", "compose", "deliver"),
        slots=(_s("to", "string", "Recipient email address.", ("to", "recipient", "address"), pool="email"),
               _s("subject", "string", "Subject line.", ("subject", "title"), pool="text"),
               _s("urgent", "boolean", "Mark the email as urgent.", ("urgent", "high_priority"),
                  choices=("urgent", "not urgent"), required=False,
                  clauses=(" Mark it {urgent}.", " It is {urgent}."))),
        requests=('Send an email to {to} with the subject "{subject}".', 'Email {to}: subject "{subject}".',
                  'Please mail {to} about "{subject}".', 'Write to {to}, subject "{subject}".'),
        intent='an email to {to} about "{subject}"',
        result=(_r("status", choices=("sent", "queued", "delivered")), _r("message_id", "id", pool="id")),
        answers=("Done: the email to {to} was {r0} (message id {r1}).", "Your email to {to} was {r0}; its id is {r1}."),
    ),
    Domain(
        key="stock", ability="look up stock prices",
        descriptions=("Get the latest price of a stock by its ticker symbol.", "Stock quote for a ticker."),
        stems=("get_stock_price", "stock_quote", "quote", "share_price"),
        namespaces=("stocks", "market", "finance", "exchange"), verbs=("quote", "price", "latest"),
        slots=(_s("symbol", "string", "The ticker symbol.", ("symbol", "ticker"), pool="ticker"),),
        requests=("What is {symbol} trading at?", "Price of {symbol} stock?", "Get me a quote for {symbol}.",
                  "How much is one share of {symbol}?"),
        intent="the share price of {symbol}",
        result=(_r("price", "last", kind="number", span=(3, 900)), _r("currency", pool="currency")),
        answers=("{symbol} is trading at {r0} {r1}.", "One share of {symbol} costs {r0} {r1}."),
        pair_requests=("Compare the prices of {a} and {b}.", "What are {a} and {b} trading at?"),
    ),
    Domain(
        key="convert_currency", ability="convert currencies",
        descriptions=("Convert an amount of money from one currency to another.", "Currency exchange calculator."),
        stems=("convert_currency", "exchange", "fx_convert", "currency_convert"),
        namespaces=("fx", "money", "currency", "bank"), verbs=("convert", "exchange", "rate"),
        slots=(_s("amount", "number", "The amount to convert.", ("amount", "value"), span=(1, 5000)),
               _s("source", "enum", "Currency to convert from.", ("from_currency", "source", "base"),
                  choices=("USD", "EUR", "GBP", "JPY", "CHF", "SEK")),
               _s("target", "enum", "Currency to convert to.", ("to_currency", "target", "quote"),
                  choices=("EUR", "USD", "GBP", "CAD", "AUD", "INR"))),
        requests=("Convert {amount} {source} to {target}.", "How much is {amount} {source} in {target}?",
                  "{amount} {source} in {target} please"),
        intent="{amount} {source} in {target}",
        result=(_r("converted", "result", kind="number", span=(1, 9000)), _r("rate", kind="number", span=(0, 2))),
        answers=("{amount} {source} is {r0} {target} (rate {r1}).", "That comes to {r0} {target} at a rate of {r1}."),
    ),
    Domain(
        key="translate", ability="translate text",
        descriptions=("Translate a text into another language.", "Machine translation of short texts."),
        stems=("translate", "translate_text", "translation"),
        namespaces=("translate", "lingo", "language", "i18n"), verbs=("text", "run", "translate"),
        slots=(_s("text", "string", "The text to translate.", ("text", "source_text", "phrase"), pool="text"),
               _s("language", "string", "Target language.", ("target_language", "language", "to"),
                  pool="language")),
        requests=('Translate "{text}" into {language}.', 'How do you say "{text}" in {language}?',
                  'Can you put "{text}" in {language}?'),
        intent='"{text}" in {language}',
        result=(_r("translation", "translated", pool="text"),),
        answers=('In {language}: "{r0}".', 'The {language} translation is "{r0}".'),
    ),
    Domain(
        key="web_search", ability="search the web",
        descriptions=("Search the web and return the top result.", "Web search engine."),
        stems=("web_search", "search", "search_web", "lookup"),
        namespaces=("web", "search", "browser", "net"), verbs=("search", "query", "find"),
        slots=(_s("query", "string", "What to search for.", ("query", "q", "terms"), pool="headline"),
               _s("max_results", "integer", "How many results.", ("max_results", "limit", "n"), span=(1, 10),
                  required=False, clauses=(" Give me {max_results} results.", " Top {max_results} only."))),
        requests=('Search the web for "{query}".', 'Look up "{query}" online.', 'Find pages about "{query}".'),
        intent='web results for "{query}"',
        result=(_r("top_result", "title", pool="title"), _r("url", "link", pool="url")),
        answers=('The top result is "{r0}" at {r1}.', 'I found "{r0}" ({r1}).'),
    ),
    Domain(
        key="restaurants", ability="find restaurants",
        descriptions=("Find a restaurant by cuisine in a city.", "Restaurant recommendations."),
        stems=("find_restaurant", "restaurant_search", "dining", "eat_out"),
        namespaces=("food", "dining", "restaurants", "places"), verbs=("find", "search", "recommend"),
        slots=(_s("cuisine", "string", "Type of food.", ("cuisine", "food", "kind"), pool="cuisine"),
               _s("city", "string", "Where to eat.", CITY, pool="city"),
               _s("price", "enum", "Price level.", ("price", "budget"), choices=("cheap", "moderate", "expensive"),
                  required=False, clauses=(" Something {price}.", " Keep it {price}."))),
        requests=("Find me a {cuisine} restaurant in {city}.", "Where can I eat {cuisine} food in {city}?",
                  "Any good {cuisine} places in {city}?"),
        intent="a {cuisine} restaurant in {city}",
        result=(_r("name", "restaurant", pool="restaurant"), _r("rating", kind="number", span=(3, 5))),
        answers=("Try {r0} in {city}, rated {r1}.", "{r0} is a {cuisine} place in {city} with a rating of {r1}."),
    ),
    Domain(
        key="flights", ability="search flights",
        descriptions=("Search flights between two cities on a date.", "Find the cheapest flight for a trip."),
        stems=("search_flights", "find_flight", "flights", "book_flight"),
        namespaces=("flights", "air", "travel", "trips"), verbs=("search", "find", "cheapest"),
        slots=(_s("origin", "string", "Departure city.", ("origin", "from_city", "departure"), pool="city"),
               _s("destination", "string", "Arrival city.", ("destination", "to_city", "arrival"), pool="city"),
               _s("date", "string", "Travel date.", ("date", "day", "departure_date"), pool="day")),
        requests=("Find a flight from {origin} to {destination} on {date}.",
                  "I need to fly {origin} to {destination} on {date}.",
                  "Flights from {origin} to {destination}, {date}?"),
        intent="a flight from {origin} to {destination} on {date}",
        result=(_r("flight", "flight_number", pool="flight"), _r("price", "fare", kind="integer", span=(40, 1500)),
                _r("departs", "departure_time", pool="time")),
        answers=("The best option is {r0} at {r2} for {r1}.", "Flight {r0} leaves at {r2} on {date} and costs {r1}."),
    ),
    Domain(
        key="hotels", ability="book hotels",
        descriptions=("Book a hotel room in a city.", "Reserve hotel nights."),
        stems=("book_hotel", "reserve_room", "hotel_booking", "stay"),
        namespaces=("hotels", "lodging", "travel", "stays"), verbs=("book", "reserve", "room"),
        slots=(_s("city", "string", "City of the hotel.", CITY, pool="city"),
               _s("nights", "integer", "Number of nights.", ("nights", "num_nights", "length"), span=(1, 14)),
               _s("guests", "integer", "Number of guests.", ("guests", "people", "adults"), span=(1, 6),
                  required=False, clauses=(" For {guests} guests.", " We are {guests} people."))),
        requests=("Book a hotel in {city} for {nights} nights.", "I need a room in {city}, {nights} nights.",
                  "Reserve {nights} nights in {city}."),
        intent="{nights} nights in {city}",
        result=(_r("hotel", "name", pool="hotel"), _r("confirmation", "booking_id", pool="id")),
        answers=("Booked {r0} in {city} for {nights} nights; confirmation {r1}.",
                 "You're staying at {r0}. Confirmation number: {r1}."),
    ),
    Domain(
        key="timer", ability="set timers",
        descriptions=("Start a countdown timer.", "Set a timer for a number of minutes."),
        stems=("set_timer", "start_timer", "timer", "countdown"),
        namespaces=("timer", "clock", "kitchen", "alarm"), verbs=("set", "start", "countdown"),
        slots=(_s("minutes", "integer", "Length in minutes.", ("minutes", "duration", "mins"), span=(1, 90)),
               _s("label", "string", "A name for the timer.", ("label", "name"), pool="word", required=False,
                  clauses=(' Call it "{label}".', ' Label it {label}.'))),
        requests=("Set a timer for {minutes} minutes.", "Start a {minutes} minute timer.",
                  "Timer, {minutes} minutes please.", "Remind me in {minutes} minutes with a timer."),
        intent="a timer of {minutes} minutes",
        result=(_r("timer_id", "id", pool="id"), _r("ends_at", "end_time", pool="time")),
        answers=("Timer set for {minutes} minutes; it ends at {r1} (id {r0}).", "Done, timer {r0} ends at {r1}."),
    ),
    Domain(
        key="reminder", ability="create reminders",
        descriptions=("Create a reminder at a given time.", "Add a reminder to the user's phone."),
        stems=("create_reminder", "remind", "add_reminder", "reminder"),
        namespaces=("reminders", "tasks", "phone", "assistant"), verbs=("create", "add", "set"),
        slots=(_s("text", "string", "What to remind about.", ("text", "message", "note"), pool="text"),
               _s("time", "string", "When, as HH:MM.", ("time", "at", "when"), pool="time")),
        requests=('Remind me at {time} that "{text}".', 'Set a reminder for {time}: {text}.',
                  'At {time}, remind me: "{text}".'),
        intent='a reminder at {time} saying "{text}"',
        result=(_r("reminder_id", "id", pool="id"), _r("scheduled", "time", copy="time")),
        answers=('I will remind you at {r1}: "{text}" (id {r0}).', "Reminder {r0} is set for {r1}."),
    ),
    Domain(
        key="music", ability="play music",
        descriptions=("Play a song on the speakers.", "Start music playback."),
        stems=("play_music", "play_song", "play", "music"),
        namespaces=("music", "player", "speaker", "audio"), verbs=("play", "start", "queue"),
        slots=(_s("song", "string", "Song title.", ("song", "track", "title"), pool="title"),
               _s("shuffle", "boolean", "Shuffle after this song.", ("shuffle",), choices=("shuffle", "no shuffle"),
                  required=False, clauses=(" Then {shuffle}.", " With {shuffle}."))),
        requests=('Play "{song}".', 'Put on "{song}" please.', 'I want to hear "{song}".'),
        intent='the song "{song}"',
        result=(_r("now_playing", "track", pool="title"), _r("volume", kind="integer", span=(10, 90))),
        answers=('Now playing "{r0}" at volume {r1}.', 'Playing "{r0}", volume {r1}.'),
    ),
    Domain(
        key="news", ability="read the news",
        descriptions=("Get the latest news headline on a topic.", "News headlines by topic."),
        stems=("get_news", "headlines", "news", "latest_news"),
        namespaces=("news", "press", "media", "feed"), verbs=("headlines", "latest", "top"),
        slots=(_s("topic", "string", "The news topic.", ("topic", "category", "subject"), pool="topic"),),
        requests=("What's the latest news about {topic}?", "Any {topic} headlines today?", "News on {topic}?"),
        intent="news about {topic}",
        result=(_r("headline", "title", pool="headline"), _r("source", pool="company")),
        answers=('Top {topic} story: "{r0}" ({r1}).', '{r1} reports: "{r0}".'),
    ),
    Domain(
        key="unit_convert", ability="convert units",
        descriptions=("Convert a length between units.", "Unit converter for distances."),
        stems=("convert_units", "unit_convert", "length_convert"),
        namespaces=("units", "convert", "measure", "math"), verbs=("convert", "length", "to"),
        slots=(_s("value", "number", "The quantity.", ("value", "amount", "quantity"), span=(1, 500)),
               _s("from_unit", "enum", "Unit of the value.", ("from_unit", "source_unit"),
                  choices=("km", "miles", "meters", "feet")),
               _s("to_unit", "enum", "Unit to convert to.", ("to_unit", "target_unit"),
                  choices=("miles", "km", "feet", "meters"))),
        requests=("Convert {value} {from_unit} to {to_unit}.", "How many {to_unit} is {value} {from_unit}?",
                  "{value} {from_unit} in {to_unit}?"),
        intent="{value} {from_unit} in {to_unit}",
        result=(_r("result", "converted", kind="number", span=(0, 2000)),),
        answers=("{value} {from_unit} is {r0} {to_unit}.", "That's {r0} {to_unit}."),
    ),
    Domain(
        key="time_zone", ability="tell the local time",
        descriptions=("Get the local time in a city.", "Current local time and time zone of a city."),
        stems=("local_time", "get_time", "world_clock", "time_in"),
        namespaces=("time", "clock", "tz", "world"), verbs=("now", "local", "get"),
        slots=(_s("city", "string", "The city.", CITY, pool="city"),),
        requests=("What time is it in {city}?", "Local time in {city}?", "Is it late in {city} now?"),
        intent="the local time in {city}",
        result=(_r("local_time", "time", pool="time"), _r("timezone", "tz", pool="tz")),
        answers=("It is {r0} in {city} ({r1}).", "The local time in {city} is {r0}, zone {r1}."),
        pair_requests=("What time is it in {a} and in {b}?",),
    ),
    Domain(
        key="tracking", ability="track packages",
        descriptions=("Track a parcel by its tracking number.", "Shipping status of a package."),
        stems=("track_package", "parcel_status", "tracking", "shipment_status"),
        namespaces=("shipping", "parcels", "post", "logistics"), verbs=("track", "status", "where"),
        slots=(_s("tracking_number", "string", "The tracking number.", ("tracking_number", "tracking_id", "number"),
                  pool="tracking"),),
        requests=("Where is my package {tracking_number}?", "Track parcel {tracking_number}.",
                  "Status of shipment {tracking_number}?"),
        intent="the status of package {tracking_number}",
        result=(_r("status", "state", pool="status"), _r("eta", "expected", pool="day")),
        answers=("Package {tracking_number} is {r0}; expected {r1}.", "Your parcel is {r0}, arriving {r1}."),
    ),
    Domain(
        key="contacts", ability="look up contacts",
        descriptions=("Find a person's phone number in the address book.", "Address book lookup."),
        stems=("find_contact", "lookup_contact", "contacts", "phone_book"),
        namespaces=("contacts", "people", "directory", "crm"), verbs=("find", "lookup", "search"),
        slots=(_s("name", "string", "The person's name.", ("name", "person", "contact"), pool="person"),),
        requests=("What's {name}'s phone number?", "Look up {name} in my contacts.", "How can I reach {name}?"),
        intent="the contact details of {name}",
        result=(_r("phone", "number", pool="phone"), _r("email", pool="email")),
        answers=("{name}: phone {r0}, email {r1}.", "You can reach {name} at {r0} or {r1}."),
        pair_requests=("Get the numbers of {a} and {b}.",),
    ),
    Domain(
        key="todo", ability="manage a to-do list",
        descriptions=("Add a task to the to-do list.", "Create a to-do item."),
        stems=("add_task", "todo_add", "create_task", "todo"),
        namespaces=("todo", "tasks", "planner", "notes"), verbs=("add", "create", "new"),
        slots=(_s("task", "string", "The task.", ("task", "title", "item"), pool="text"),
               _s("priority", "enum", "Task priority.", ("priority", "importance"), choices=("low", "medium", "high"),
                  required=False, clauses=(" Priority {priority}.", " Make it {priority} priority."))),
        requests=('Add "{task}" to my to-do list.', 'New task: {task}.', 'Put "{task}" on my list.'),
        intent='the task "{task}"',
        result=(_r("task_id", "id", kind="integer", span=(1, 999)), _r("open_tasks", "remaining", kind="integer",
                                                                       span=(1, 40))),
        answers=('Added "{task}" as task {r0}; you have {r1} open tasks.', "Task {r0} added. Open tasks: {r1}."),
    ),
    Domain(
        key="lights", ability="control the lights",
        descriptions=("Switch the lights of a room on or off.", "Smart home light control."),
        stems=("set_lights", "switch_light", "lights", "toggle_lights"),
        namespaces=("home", "lights", "smarthome", "house"), verbs=("switch", "set", "toggle"),
        slots=(_s("room", "string", "The room.", ("room", "area", "zone"), pool="room"),
               _s("on", "boolean", "True to switch on, false to switch off.", ("on", "power", "state"),
                  choices=("on", "off")),
               _s("brightness", "integer", "Brightness percent.", ("brightness", "level"), span=(5, 100),
                  required=False, clauses=(" At {brightness} percent.", " Brightness {brightness}."))),
        requests=("Turn {on} the lights in the {room}.", "Switch the {room} lights {on}.", "{room} lights {on}"),
        intent="the {room} lights {on}",
        result=(_r("state", copy="on"), _r("room", copy="room")),
        answers=("The {r1} lights are now {r0}.", "Done: {r1} lights {r0}."),
    ),
    Domain(
        key="thermostat", ability="set the heating",
        descriptions=("Set the thermostat to a target temperature.", "Heating and cooling control."),
        stems=("set_thermostat", "set_temperature", "thermostat", "heating"),
        namespaces=("home", "climate", "hvac", "thermo"), verbs=("set", "target", "adjust"),
        slots=(_s("temperature", "number", "Target temperature in degrees.", ("temperature", "target", "degrees"),
                  span=(15, 28)),),
        requests=("Set the heating to {temperature} degrees.", "Make it {temperature} degrees in here.",
                  "Thermostat to {temperature}."),
        intent="the thermostat at {temperature} degrees",
        result=(_r("target", "setpoint", copy="temperature"), _r("current", "now", kind="number", span=(12, 30))),
        answers=("The thermostat is set to {r0}; it is {r1} now.", "Target {r0} degrees, currently {r1}."),
    ),
    Domain(
        key="movies", ability="find movie showtimes",
        descriptions=("Find showtimes for a movie in a city.", "Cinema listings."),
        stems=("movie_showtimes", "showtimes", "find_screening", "cinema"),
        namespaces=("movies", "cinema", "films", "tickets"), verbs=("showtimes", "listings", "find"),
        slots=(_s("movie", "string", "Movie title.", ("movie", "title", "film"), pool="title"),
               _s("city", "string", "City.", CITY, pool="city")),
        requests=('When is "{movie}" showing in {city}?', 'Showtimes for "{movie}" in {city}?',
                  'Can I see "{movie}" in {city} tonight?'),
        intent='showtimes of "{movie}" in {city}',
        result=(_r("next_showing", "time", pool="time"), _r("cinema", "venue", pool="company")),
        answers=('"{movie}" is next showing at {r0} at {r1}.', "Next screening: {r0} at {r1} in {city}."),
    ),
    Domain(
        key="recipes", ability="find recipes",
        descriptions=("Find a recipe using an ingredient.", "Recipe search by ingredient."),
        stems=("find_recipe", "recipe_search", "recipes", "cookbook"),
        namespaces=("recipes", "kitchen", "cook", "food"), verbs=("find", "search", "suggest"),
        slots=(_s("ingredient", "string", "Main ingredient.", ("ingredient", "main_ingredient", "with"),
                  pool="ingredient"),
               _s("max_minutes", "integer", "Maximum cooking time.", ("max_minutes", "time_limit"), span=(10, 90),
                  required=False, clauses=(" Under {max_minutes} minutes.", " I have {max_minutes} minutes."))),
        requests=("Give me a recipe with {ingredient}.", "What can I cook with {ingredient}?",
                  "Recipe ideas for {ingredient}?"),
        intent="a recipe with {ingredient}",
        result=(_r("recipe", "name", pool="title"), _r("minutes", "time", kind="integer", span=(10, 90))),
        answers=('Try "{r0}", ready in {r1} minutes.', '"{r0}" uses {ingredient} and takes {r1} minutes.'),
    ),
    Domain(
        key="dictionary", ability="define words",
        descriptions=("Look up the definition of a word.", "Dictionary definitions."),
        stems=("define", "define_word", "dictionary", "lookup_word"),
        namespaces=("dictionary", "words", "lexicon", "vocab"), verbs=("define", "lookup", "meaning"),
        slots=(_s("word", "string", "The word.", ("word", "term", "entry"), pool="word"),),
        requests=('What does "{word}" mean?', 'Define {word}.', 'Meaning of the word "{word}"?'),
        intent='the meaning of "{word}"',
        result=(_r("definition", "meaning", pool="text"),),
        answers=('"{word}" means: {r0}.', 'Definition of {word}: {r0}.'),
    ),
    Domain(
        key="calculator", ability="do calculations",
        descriptions=("Evaluate an arithmetic expression.", "Calculator for arithmetic."),
        stems=("calculate", "calculator", "evaluate", "compute"),
        namespaces=("math", "calc", "calculator", "numbers"), verbs=("evaluate", "compute", "run"),
        slots=(_s("expression", "string", "The expression, like 12 * 7.", ("expression", "expr", "formula"),
                  pool="expression"),),
        requests=("What is {expression}?", "Calculate {expression}.", "Compute {expression} for me."),
        intent="the value of {expression}",
        result=(_r("value", "result", kind="integer", span=(-100, 9800)),),
        answers=("{expression} = {r0}.", "The answer is {r0}."),
    ),
    Domain(
        key="sports", ability="get sports scores",
        descriptions=("Get the latest score of a team.", "Sports results by team."),
        stems=("team_score", "get_score", "scores", "match_result"),
        namespaces=("sports", "scores", "league", "match"), verbs=("score", "latest", "result"),
        slots=(_s("team", "string", "Team name.", ("team", "club", "side"), pool="team"),),
        requests=("How did {team} do?", "Latest {team} score?", "Did {team} win their last game?"),
        intent="the last result of {team}",
        result=(_r("score", "result", pool="score"), _r("opponent", "against", pool="team")),
        answers=("{team} played {r1}: {r0}.", "Last game: {team} vs {r1}, {r0}."),
    ),
    Domain(
        key="directions", ability="plan routes",
        descriptions=("Travel time and distance between two places.", "Route planner."),
        stems=("get_directions", "route", "plan_route", "travel_time"),
        namespaces=("maps", "routes", "navigation", "geo"), verbs=("directions", "route", "plan"),
        slots=(_s("start", "string", "Starting point.", ("start", "origin", "from_place"), pool="city"),
               _s("end", "string", "Destination.", ("end", "destination", "to_place"), pool="city"),
               _s("mode", "enum", "How to travel.", ("mode", "transport"), choices=("driving", "walking", "transit"),
                  required=False, clauses=(" By {mode}.", " I'll be {mode}."))),
        requests=("How long from {start} to {end}?", "Directions from {start} to {end}, please.",
                  "Route {start} to {end}?"),
        intent="a route from {start} to {end}",
        result=(_r("minutes", "duration", kind="integer", span=(5, 600)),
                _r("distance_km", "km", kind="number", span=(1, 900))),
        answers=("From {start} to {end} takes {r0} minutes ({r1} km).", "{r0} minutes, {r1} km."),
    ),
    Domain(
        key="orders", ability="check orders",
        descriptions=("Get the status of a customer order.", "Order status lookup."),
        stems=("order_status", "get_order", "check_order", "orders"),
        namespaces=("shop", "orders", "store", "sales"), verbs=("status", "get", "check"),
        slots=(_s("order_id", "string", "The order id.", ("order_id", "order", "id"), pool="order_id"),),
        requests=("What's the status of order {order_id}?", "Check my order {order_id}.", "Has {order_id} shipped?"),
        intent="the status of order {order_id}",
        result=(_r("status", "state", pool="status"), _r("total", "amount", kind="number", span=(5, 400))),
        answers=("Order {order_id} is {r0} (total {r1}).", "Your order is {r0}; it came to {r1}."),
    ),
    Domain(
        key="files", ability="read files",
        descriptions=("Read the first line of a text file.", "Open a file and return its content."),
        stems=("read_file", "open_file", "cat", "file_read"),
        namespaces=("files", "fs", "disk", "storage"), verbs=("read", "open", "head"),
        slots=(_s("path", "string", "Path of the file.", ("path", "file", "filename"), pool="path"),),
        requests=("Show me the first line of {path}.", "What's in {path}?", "Open {path}."),
        intent="the content of {path}",
        result=(_r("first_line", "content", pool="text"), _r("lines", kind="integer", span=(1, 500))),
        answers=('{path} starts with "{r0}" and has {r1} lines.', 'First line: "{r0}" ({r1} lines).'),
    ),
    Domain(
        key="payments", ability="send money",
        descriptions=("Send money to a person.", "Payment transfer to a contact."),
        stems=("send_money", "pay", "transfer", "payment"),
        namespaces=("pay", "wallet", "bank", "payments"), verbs=("send", "transfer", "pay"),
        slots=(_s("recipient", "string", "Who gets the money.", ("recipient", "payee", "to"), pool="person"),
               _s("amount", "number", "Amount.", ("amount", "sum"), span=(1, 900)),
               _s("currency", "enum", "Currency.", ("currency",), choices=("EUR", "USD", "GBP"), required=False,
                  clauses=(" In {currency}.", " Use {currency}."))),
        requests=("Send {amount} to {recipient}.", "Pay {recipient} {amount}.", "Transfer {amount} to {recipient}."),
        intent="a payment of {amount} to {recipient}",
        result=(_r("transaction_id", "id", pool="id"), _r("balance", kind="number", span=(0, 9000))),
        answers=("Sent {amount} to {recipient} (transaction {r0}). Balance: {r1}.",
                 "Payment done, id {r0}; your balance is {r1}."),
    ),
    Domain(
        key="group_message", ability="message groups",
        descriptions=("Send a chat message to several people.", "Group messaging."),
        stems=("message_group", "send_message", "group_chat", "broadcast"),
        namespaces=("chat", "messages", "team", "social"), verbs=("send", "broadcast", "post"),
        slots=(_s("recipients", "array", "The people to message.", ("recipients", "people", "members"),
                  pool="person"),
               _s("text", "string", "The message.", ("text", "message", "body"), pool="text")),
        requests=('Message {recipients}: "{text}".', 'Tell {recipients} "{text}".', 'Send "{text}" to {recipients}.'),
        intent='"{text}" to {recipients}',
        result=(_r("delivered", "sent_to", kind="integer", span=(1, 6)), _r("thread", "thread_id", pool="id")),
        answers=("Sent to {r0} people in thread {r1}.", 'Your message reached {r0} people (thread {r1}).'),
    ),
)

DOMAINS_BY_KEY = {domain.key: domain for domain in DOMAINS}
