"""``--model_name tiny-gpt2``: a small GPT-2 built offline, for tests and the CPU demo.

It is NOT pretrained: the weights are random (seeded) and the byte-level BPE
tokenizer is trained here on a fixed text about our environments. It exists so
every command of the project runs offline and fast; what it learns comes only from
our own SFT and RL. Every choice label is one token and both prompt markers end in
a token boundary, exactly as :func:`prompts.label_token_ids` demands of any tokenizer.

The build is deterministic (same bytes every time) and cached under
``$REFLECTRL_CACHE`` (default ``<repo>/.cache``), in a folder named after a hash of
everything that shapes it; concurrent builders race harmlessly (atomic rename).
"""

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from prompts import ACTION_MARKER, ANALYZE_MARKER, LABELS, label_token_ids
from utils.paths import cache_root

logger = logging.getLogger(__name__)

NAME = "tiny-gpt2"
BUILD_VERSION = 4
VOCAB_SIZE = 4096
MODEL_CONFIG = {"n_positions": 2048, "n_embd": 128, "n_layer": 4, "n_head": 4}
INIT_SEED = 0
# Random embeddings (std 0.02) tied to the LM head cap the logits near +-2.5, so a LoRA
# adapter alone could never make a confident prediction over thousands of tokens; a
# pretrained model has learned a larger final-norm scale, and we start with one.
FINAL_NORM_SCALE = 5.0

_TAXI = """\
+---------+
|R: | : :G|
| : | : : |
| : : : : |
| | : | : |
|Y| : |B: |
+---------+
You are driving a taxi in a 5x5 grid. T is the taxi, P the passenger, D the destination,
O means the taxi is on the passenger's cell and X that the passenger is in the taxi.
Drive to the passenger, pick the passenger up, drive to the destination and drop the passenger off.
Driving into a wall, picking up where there is no passenger or dropping off in a wrong place ends the game.
--- Current State ---
--- History ---
Move south. Move north. Move east. Move west. Pickup passenger. Drop off passenger.
The actions you can take now is:
The taxi is at row 2, column 3. The passenger is at R and wants to go to G.
The passenger is in the taxi. The last move was good. Next, the taxi should move north to reach the passenger.
That move was a mistake: it took the taxi away from the destination, so it should go back west.
Taxi at row 2, column 3; passenger at Y (row 4, column 0), going to R. First move; now head south to reach the passenger.
Taxi at row 0, column 1 with the passenger, going to G (row 0, column 4). Last move was good; now head east.
Taxi at row 4, column 3; passenger at B (row 4, column 3), going to G. Last move was a detour; now pick up here.
Taxi at row 1, column 4; passenger at R (row 0, column 0), going to Y. Now head west; now head north; drop off here
to reach the destination; to finish the ride; to start the ride.
"""

_AUTO_EXPLORE = """\
# Task
# Current working directory
# Files under current working directory
# Command history
# Execution result of your last command
# Choose from below your command
cd .. cd src ls cat README.md head setup.py tail data.csv id utils.py
Error: No such file or directory. Warning: the output was truncated.
The file was read; it does not answer the question, so go back to the parent folder.
The question asks about a function, so the answer is likely in a Python file under the package folder.
Which file defines the function that parses the configuration? Find the file that documents the installation.
def class import from return self None True False if else elif for while in with as try except raise yield lambda
__init__.py main.py test.py config.yaml README.rst index.md requirements.txt docs src lib tests examples
.py .c .cpp .h .java .go .ipynb .csv .tsv .txt .md .rst .json .yaml .yml .sh
"""

_ALFWORLD = """\
You are in the middle of a room. Looking quickly around you, you see a countertop 1, a cabinet 2,
a drawer 3, a fridge 1, a microwave 1, a sinkbasin 1, a stoveburner 1, a shelf 1, a garbagecan 1.
Your task is to: put a tomato in microwave. Your task is to: put some tomato on countertop.
go to countertop 1 take tomato 1 from countertop 1 move tomato 1 to microwave 1 open microwave 1
close microwave 1 examine fridge 1 inventory look heat tomato 1 with microwave 1 cool clean slice
You arrive at countertop 1. On the countertop 1, you see a tomato 1, a apple 2 and a knife 1.
You pick up the tomato 1 from the countertop 1. You open the microwave 1. The microwave 1 is open.
Nothing happens. You won!
"""

_ENGLISH = """\
the of and to a in is it you that he was for on are with as his they be at one have this from or had by
not word but what some we can out other were all there when up use your how said an each she which do
their time if will way about many then them write would like so these her long make thing see him two
has look more day could go come did number sound no most people my over know water than call first who
may down side been now find any new work part take get place made live where after back little only
round man year came show every good me give our under name very through just form sentence great think
say help low line differ turn cause much mean before move right boy old too same tell does set three want
air well also play small end put home read hand port large spell add even land here must big high such
follow act why ask men change went light kind off need house picture try us again animal point mother
world near build self earth father head stand own page should country found answer school grow study
still learn plant cover food sun four between state keep eye never last let thought city tree cross farm
hard start might story saw far sea draw left late run while press close night real life few north open
seem together next white children begin got walk example ease paper group always music those both mark
often letter until mile river car feet care second book carry took science eat room friend began idea
fish mountain stop once base hear horse cut sure watch color face wood main enough plain girl usual
young ready above ever red list though feel talk bird soon body dog family direct pose leave song
measure door product black short numeral class wind question happen complete ship area half rock order
fire south problem piece told knew pass since top whole king space heard best hour better true during
hundred five remember step early hold west ground interest reach fast verb sing listen six table travel
less morning ten simple several vowel toward war lay against pattern slow center love person money serve
appear road map rain rule govern pull cold notice voice unit power town fine certain fly fall lead cry
dark machine note wait plan figure star box noun field rest correct able pound done beauty drive stood
contain front teach week final gave green oh quick develop ocean warm free minute strong special mind
behind clear tail produce fact street inch multiply nothing course stay wheel full force blue object
decide surface deep moon island foot system busy test record boat common gold possible plane stead dry
wonder laugh thousand ago ran check game shape equate hot miss brought heat snow tire bring yes distant
fill east paint language among grand ball yet wave drop heart am present heavy dance engine position arm
wide sail material size vary settle speak weight general ice matter circle pair include divide syllable
felt perhaps pick sudden count square reason length represent art subject region energy hunt probable
bed brother egg ride cell believe fraction forest sit race window store summer train sleep prove lone
leg exercise wall catch mount wish sky board joy winter sat written wild instrument kept glass grass cow
job edge sign visit past soft fun bright gas weather month million bear finish happy hope flower clothe
strange gone jump baby eight village meet root buy raise solve metal whether push seven paragraph third
shall held hair describe cook floor either result burn hill safe cat century consider type law bit coast
copy phrase silent tall sand soil roll temperature finger industry value fight lie beat excite natural
view sense ear else quite broke case middle kill son lake moment scale loud spring observe child straight
consonant nation dictionary milk speed method organ pay age section dress cloud surprise quiet stone tiny
climb cool design poor lot experiment bottom key iron single stick flat twenty skin smile crease hole
trade melody trip office receive row mouth exact symbol die least trouble shout except wrote seed tone
join suggest clean break lady yard rise bad blow oil blood touch grew cent mix team wire cost lost brown
wear garden equal sent choose fell fit flow fair bank collect save control decimal gentle woman captain
practice separate difficult doctor please protect noon whose locate ring character insect caught period
indicate radio spoke atom human history effect electric expect crop modern element hit student corner
party supply bone rail imagine provide agree thus capital chair danger fruit rich thick soldier process
operate guess necessary sharp wing create neighbor wash bat rather crowd corn compare poem string bell
depend meat rub tube famous dollar stream fear sight thin triangle planet hurry chief colony clock mine
tie enter major fresh search send yellow gun allow print dead spot desert suit current lift rose arrive
master track parent shore division sheet substance favor connect post spend chord fat glad original share
station dad bread charge proper bar offer segment slave duck instant market degree populate chick dear
enemy reply drink occur support speech nature range steam motion path liquid log meant quotient teeth
shell neck oxygen sugar death pretty skill women season solution magnet silver thank branch match suffix
especially fig afraid huge sister steel discuss forward similar guide experience score apple bought led
pitch coat mass card band rope slip win dream evening condition feed tool total basic smell valley nor
double seat continue block chart hat sell success company subtract event particular deal swim term
opposite wife shoe shoulder spread arrange camp invent cotton born determine quart nine truck noise level
chance gather shop stretch throw shine property column molecule select wrong gray repeat require broad
prepare salt nose plural anger claim continent
"""


def _corpus() -> str:
    """The tokenizer's training text: our environments' words, the markers, every label."""
    enumerations = []
    for _ in range(40):
        for label in LABELS:
            enumerations.append(f"{label}. move north\n{ACTION_MARKER}{label}\n")
    parts = [_TAXI, _AUTO_EXPLORE, _ALFWORLD, _ENGLISH, ANALYZE_MARKER * 50, "".join(enumerations)]
    return "\n".join(part * 20 if part in (_TAXI, _AUTO_EXPLORE, _ALFWORLD) else part for part in parts)


def _fingerprint() -> str:
    import tokenizers
    import transformers

    blob = json.dumps(
        {"version": BUILD_VERSION, "vocab": VOCAB_SIZE, "config": MODEL_CONFIG, "seed": INIT_SEED,
         "final_norm_scale": FINAL_NORM_SCALE,
         "corpus": hashlib.sha256(_corpus().encode()).hexdigest(),
         "transformers": transformers.__version__, "tokenizers": tokenizers.__version__},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def tiny_gpt2_path() -> Path:
    """The directory of the tiny model, built on first use."""
    target = cache_root() / f"{NAME}-{_fingerprint()}"
    if not (target / "config.json").is_file():
        build(target)
    return target


def build(target: Path) -> None:
    """Build the tokenizer and the random model into ``target`` (atomically)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        tokenizer = _train_tokenizer()
        label_token_ids(tokenizer, LABELS)  # the paper's labels, each one token
        tokenizer.save_pretrained(scratch)
        _random_model(tokenizer).save_pretrained(scratch)
        try:
            os.rename(scratch, target)
        except OSError:
            if (target / "config.json").is_file():
                logger.info("another process built %s first", target)
                return
            # a folder of that name without the model (a copy cut short): set it aside, then put ours in place
            aside = Path(tempfile.mkdtemp(prefix=f".{target.name}-broken-", dir=target.parent))
            os.rename(target, aside / "old")
            shutil.rmtree(aside, ignore_errors=True)
            os.rename(scratch, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Tokenizer

    eos = "<|endoftext|>"
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[eos],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus().splitlines(keepends=True), trainer=trainer)
    state = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    return GPT2Tokenizer(vocab=state["vocab"], merges=merges, eos_token=eos, bos_token=eos,
                         unk_token=eos, pad_token=eos, padding_side="left")


def _random_model(tokenizer):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=len(tokenizer), bos_token_id=tokenizer.eos_token_id,
                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id,
                        **MODEL_CONFIG)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(INIT_SEED)
        model = GPT2LMHeadModel(config)
    with torch.no_grad():
        model.transformer.ln_f.weight.fill_(FINAL_NORM_SCALE)
    return model
