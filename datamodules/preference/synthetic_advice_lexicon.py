"""Word lists and templates of the "advice" preference benchmark (data only; the logic is in
`datamodules.preference.synthetic_advice`, the design in docs/hub_benchmarks.md).

A lexicon of its own, sharing no subject, template or cue with the shipped generator's
(`synthetic_lexicon`), so that a recipe tuned there is tested on text it has never seen.

Conventions the generator and tests/test_hub_benchmarks.py rely on:
- A subject's words occur nowhere else in its domain (no other subject, lead, request or answer template,
  advice fragment, nor any cue or acknowledgement): a response names the prompt's subject only where it really
  addresses it, and "which subject does this text name" has one answer.
- The cue's words ("experts", "source", "research", ...) and its brackets occur nowhere outside the cue, so the cue
  is read from the text alone (`has_cue`).
- Subjects are natural names of mixed word frequency (roses and agapanthus, the guitar and the hurdy gurdy), chosen
  as a gardener, a coach, a music teacher or a vet would list them -- not by any model's vocabulary.
- Fragments are lowercase imperative clauses without final punctuation: they fit every answer template of their
  domain. No apostrophes and no "!".
"""
from __future__ import annotations

# Optional context sentences before a request (as one message, or as an earlier turn of the conversation).
SHARED_LEADS = ("", "", "Hi there.", "Quick one for you.", "I would appreciate some help.")

# The authority / citation cue: an opening attribution, a closing citation, or both (each form 1/3).
CUE_OPENERS = (
    "According to experts:",
    "Research shows the following.",
    "Specialists broadly agree on this.",
    "Published studies confirm this.",
    "Based on professional guidelines:",
)
CUE_CLOSERS = (
    "(Source: a peer reviewed study)",
    "(Source: a university extension report)",
    "[Reference: an official handbook]",
    "Cited from an expert panel review.",
    "(As recommended by leading authorities)",
)

DOMAINS = {
    "gardening": {
        "leads": ("I just moved into a house with a big garden.", "My balcony gets a lot of wind.",
                  "I am a complete beginner with plants."),
        "subjects": (
            "roses", "tulips", "lavender", "sunflowers", "daffodils", "hydrangeas", "peonies", "dahlias",
            "marigolds", "geraniums", "petunias", "begonias", "orchids", "succulents", "ferns", "hostas",
            "clematis", "wisteria", "camellias", "azaleas", "rhododendrons", "magnolias", "hellebores",
            "foxgloves", "agapanthus", "echinacea", "heuchera", "astilbe", "crocosmia", "nasturtiums",
            "snapdragons", "zinnias", "alliums", "irises", "lilies", "poppies", "bluebells", "snowdrops",
            "strawberries", "raspberries", "blueberries", "gooseberries", "rhubarb", "asparagus", "courgettes",
            "kohlrabi", "salsify", "runner beans", "boxwood", "bamboo",
        ),
        "questions": {
            "planting": {
                "requests": ("When should I plant {s}?", "How do I get {s} started in the garden?",
                             "Where is the best spot to grow {s}?", "I want to grow {s} this year. Where do I begin?"),
                "advice": ("wait until the last frost has passed", "dig a hole twice as wide as the root ball",
                           "choose a sheltered spot with morning sun", "work some compost into the bed first",
                           "leave a hand span between each plant", "firm the earth gently around the base"),
            },
            "watering": {
                "requests": ("How often should I water {s}?", "What should I feed my {s} with?",
                             "How do I keep {s} going through a dry summer?", "How much fertiliser do {s} need?"),
                "advice": ("water deeply once a week rather than a little every day", "water at the base in the morning",
                           "add a layer of mulch to hold moisture", "feed with a balanced liquid fertiliser monthly",
                           "check the soil with a finger before watering", "cut back on feeding after midsummer"),
            },
            "pruning": {
                "requests": ("How should I prune {s}?", "When is the right time to cut back {s}?",
                             "How hard can I trim {s}?", "What is the right way to tidy up {s} after flowering?"),
                "advice": ("use clean sharp secateurs", "cut just above an outward facing bud",
                           "remove dead and crossing stems first", "never take more than a third at once",
                           "prune on a dry day in late winter", "clear away the clippings afterwards"),
            },
            "pests": {
                "requests": ("Something keeps eating my {s}. What can I do?", "How do I keep pests off {s}?",
                             "How do I protect {s} from slugs and aphids?",
                             "Something is wrong with my {s}. How do I fix it?"),
                "advice": ("check under the leaves every few days", "pick off damaged growth by hand",
                           "spray aphids off with a jet of water", "set beer traps for slugs at dusk",
                           "encourage ladybirds and birds into the garden", "improve air flow by thinning crowded growth"),
            },
        },
        "answers": (
            "With {s}, most gardeners {a1}. It is also wise to {a2}.",
            "Here is my routine for {s}: {a1}, and then {a2}.",
            "I have had good results with {s} when I {a1} and {a2}.",
            "The key with {s} is to {a1}. Later in the season, {a2}.",
            "What worked in my own garden for {s}: {a1}, and {a2}.",
            "My tip for {s} is simple. First {a1}, and after that {a2}.",
            "Looking after {s} is mostly about timing. {a1}, then {a2}.",
            "If I were growing {s}, I would {a1} and also {a2}.",
        ),
    },
    "fitness": {
        "leads": ("I started going to the gym last month.", "I am training for a charity event.",
                  "I work long hours at a desk."),
        "subjects": (
            "squats", "lunges", "planks", "burpees", "deadlifts", "push-ups", "kettlebell swings", "box jumps",
            "jumping jacks", "mountain climbers", "bench presses", "hip thrusts", "calf raises", "bicep curls",
            "tricep dips", "rowing", "skipping", "stair climbing", "hill sprints", "jogging", "cycling",
            "swimming", "pilates", "yoga", "tai chi", "kickboxing", "bouldering", "calisthenics", "foam rolling",
            "hamstring stretches", "Turkish getups", "farmer carries", "sled pushes", "battle ropes",
            "medicine ball slams", "resistance bands", "Nordic walking", "plyometrics", "wall sits",
            "glute bridges", "crunches", "aqua aerobics", "zumba", "barre workouts", "marathons", "spinning",
        ),
        "questions": {
            "form": {
                "requests": ("How do I do {s} with good form?", "What am I doing wrong with {s}?",
                             "What should I focus on when I practise {s}?", "Can you check my technique for {s}?"),
                "advice": ("keep your core braced throughout", "move slowly and under control",
                           "film yourself once a week to spot mistakes", "breathe out on the hardest part",
                           "keep your knees in line with your toes", "stop each set before your posture slips"),
            },
            "progress": {
                "requests": ("How do I get better at {s}?", "I have stalled with {s}. How do I make progress?",
                             "How can I build up to more {s}?", "What is a good plan for improving at {s}?"),
                "advice": ("add a little volume every week", "track every session in a notebook",
                           "change one variable at a time", "take an easy week every month",
                           "set a small target for the next four weeks",
                           "practise the easier version until it feels smooth"),
            },
            "recovery": {
                "requests": ("How do I avoid injury with {s}?", "I feel sore after {s}. What helps?",
                             "How long should I rest between sessions of {s}?", "Is it safe to do {s} every day?"),
                "advice": ("warm up for ten minutes first", "sleep at least seven hours a night",
                           "leave a rest day between hard sessions", "drink plenty of water afterwards",
                           "ease off at the first sign of sharp pain", "walk gently on your days off"),
            },
            "schedule": {
                "requests": ("How often should I do {s}?", "How do I fit {s} into a busy week?",
                             "When is the best time of day for {s}?", "How long should a session of {s} last?"),
                "advice": ("aim for two or three short sessions a week", "book the sessions in your calendar",
                           "keep each session under forty minutes", "pair it with a lighter activity on other days",
                           "train at the same time each day", "plan the week on a Sunday evening"),
            },
        },
        "answers": (
            "For {s}, coaches usually tell people to {a1}. You should also {a2}.",
            "Here is how I would approach {s}: {a1}, and {a2}.",
            "With {s}, the basics matter most. {a1}, then {a2}.",
            "A solid approach to {s} is to {a1} and to {a2}.",
            "Most people get more out of {s} once they {a1}. It also pays to {a2}.",
            "My rule for {s} is this: {a1}. On top of that, {a2}.",
            "To get {s} right, {a1}. After a few weeks, {a2}.",
            "When clients ask me about {s}, I say {a1} and {a2}.",
        ),
    },
    "music": {
        "leads": ("I am an adult beginner.", "My son wants to join the school band.",
                  "I played a little as a child and want to start again."),
        "subjects": (
            "guitar", "piano", "violin", "viola", "cello", "double bass", "ukulele", "banjo", "mandolin",
            "harmonica", "drum kit", "saxophone", "trumpet", "clarinet", "flute", "oboe", "bassoon",
            "French horn", "tuba", "trombone", "accordion", "harp", "sitar", "bagpipes", "theremin", "djembe",
            "marimba", "xylophone", "glockenspiel", "synthesizer", "recorder", "piccolo", "cornet", "euphonium",
            "lute", "zither", "kalimba", "tabla", "bongos", "steel pan", "didgeridoo", "hurdy gurdy",
            "dulcimer", "lyre", "ocarina", "bouzouki", "balalaika", "koto", "erhu",
        ),
        "questions": {
            "starting": {
                "requests": ("How do I start learning the {s}?", "Is the {s} hard to pick up as a beginner?",
                             "What should I learn first on the {s}?", "I want to take up the {s}. Any advice?"),
                "advice": ("find a teacher for the first few lessons", "learn to read simple notation early",
                           "start with short pieces you already know", "keep the first sessions to twenty minutes",
                           "rent before you buy", "join a beginner group for motivation"),
            },
            "practice": {
                "requests": ("How should I practise the {s} each day?",
                             "How do I stop my {s} practice from feeling stale?",
                             "How can I improve faster on the {s}?", "What is a good daily routine for the {s}?"),
                "advice": ("play slowly with a metronome", "record yourself and listen back",
                           "split each session into technique and pieces", "repeat the hardest bar five times",
                           "end every session with something you enjoy", "practise a little every single day"),
            },
            "care": {
                "requests": ("How do I look after my {s}?", "How should I clean my {s}?",
                             "How do I store my {s} between sessions?", "What maintenance does the {s} need?"),
                "advice": ("wipe it down after every session", "keep it in its case away from radiators",
                           "have it checked by a repairer once a year", "avoid sudden changes in humidity",
                           "never leave it in a hot car", "wash your hands before you play"),
            },
            "performing": {
                "requests": ("How do I get over nerves when playing the {s} for others?",
                             "How do I prepare a piece on the {s} for a concert?",
                             "What should I know before my first gig on the {s}?",
                             "How can I sound more confident on the {s} in front of people?"),
                "advice": ("play the piece for friends a week before", "memorise the opening bars",
                           "arrive early to settle in", "take slow deep breaths before you begin",
                           "keep going if you slip, since the audience rarely notices", "plan what to do between pieces"),
            },
        },
        "answers": (
            "On the {s}, good teachers say to {a1}. It is worth trying to {a2} as well.",
            "Here is what helped me with the {s}: {a1}, and {a2}.",
            "For the {s}, I would {a1}. Once that feels natural, {a2}.",
            "A sensible plan for the {s} is to {a1} and then {a2}.",
            "Many players of the {s} find it useful to {a1}. They also {a2}.",
            "My suggestion for the {s}: {a1}. Beyond that, {a2}.",
            "With the {s}, patience pays off. {a1}, and {a2}.",
            "If you are serious about the {s}, {a1} and {a2}.",
        ),
    },
    "pets": {
        "leads": ("We just adopted from a rescue centre.", "My children have been begging for a pet.",
                  "I live in a small flat."),
        "subjects": (
            "hamsters", "guinea pigs", "rabbits", "ferrets", "budgies", "cockatiels", "canaries", "goldfish",
            "bettas", "axolotls", "tortoises", "bearded dragons", "leopard geckos", "corn snakes", "chinchillas",
            "gerbils", "rats", "mice", "hedgehogs", "sugar gliders", "parrots", "lovebirds", "finches",
            "cockatoos", "koi", "guppies", "neon tetras", "hermit crabs", "tarantulas", "chameleons", "iguanas",
            "degus", "tree frogs", "ball pythons", "beagles", "labradors", "greyhounds", "dachshunds", "poodles",
            "huskies", "collies", "pugs", "Siamese cats", "Maine Coons", "ragdolls", "chickens", "ducks",
            "alpacas", "ponies", "donkeys",
        ),
        "questions": {
            "feeding": {
                "requests": ("What should I feed my {s}?", "How much food do my {s} need?",
                             "Are there foods my {s} should never eat?", "How often should I feed my {s}?"),
                "advice": ("follow the portion guide from your vet", "keep fresh water available at all times",
                           "introduce any new food slowly", "avoid sugary treats completely",
                           "weigh them once a month to track changes", "feed at the same times each day"),
            },
            "housing": {
                "requests": ("What kind of home do my {s} need?", "How should I set up a space for my {s}?",
                             "How big should the enclosure be for my {s}?", "Where in the house should my {s} live?"),
                "advice": ("give them more room than the minimum", "keep the space away from draughts",
                           "add hiding places and things to explore", "clean the bedding every week",
                           "keep the temperature steady", "place the enclosure somewhere quiet"),
            },
            "health": {
                "requests": ("How do I keep my {s} healthy?", "What signs of illness should I watch for in my {s}?",
                             "How often should my {s} see a vet?", "How do I groom my {s}?"),
                "advice": ("book a yearly check with your vet", "watch for changes in appetite",
                           "check the eyes and coat every week", "keep a simple health diary",
                           "ask your vet about parasite control", "handle them gently during checks"),
            },
            "handling": {
                "requests": ("How do I get my {s} used to being handled?", "How can I bond with my {s}?",
                             "How do I train my {s}?", "My {s} seem nervous around people. What should I do?"),
                "advice": ("move slowly and speak softly", "reward calm behaviour with a small treat",
                           "keep the first sessions very short", "let them come to you first",
                           "handle them at the same time every day", "never grab them from above"),
            },
        },
        "answers": (
            "With {s}, experienced keepers {a1}. It also helps to {a2}.",
            "Here is what I do for my own {s}: {a1}, and {a2}.",
            "For {s}, the most important thing is to {a1}. Then {a2}.",
            "Caring for {s} gets easier once you {a1} and {a2}.",
            "A good habit with {s} is to {a1}. You can also {a2}.",
            "My advice for anyone with {s}: {a1}, and then {a2}.",
            "Owners of {s} often forget to {a1}. Remember to {a2} too.",
            "If I had {s} at home, I would {a1} and {a2}.",
        ),
    },
}

# Assistant turns between a lead and the request, where a conversation is written as several turns.
ACKNOWLEDGEMENTS = ("Sure. What would you like to know?", "Of course. What is your question?",
                    "I can try to help. What is it?")
