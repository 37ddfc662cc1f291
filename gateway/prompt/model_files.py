"""Load what the Gateway needs from a Hugging Face style model directory, without transformers:
tokenizer.json (Rust tokenizers), the chat template, special tokens and the context window."""

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict
from tokenizers import Tokenizer


class ModelFiles(BaseModel):
    """The pieces of a model directory the Gateway reads, validated once at start-up."""

    model_config = ConfigDict(extra="forbid")

    tokenizer_path: Path
    chat_template: str
    bos_token: str | None
    eos_token: str
    end_of_turn: list[str]
    context_window: int | None
    vocab_size: int | None = None
    """The model's token ids are 0 to vocab_size - 1 (config.json; None: not stated)."""


class ModelFilesError(ValueError):
    """The tokenizer directory lacks something the Gateway cannot run without."""


def _token_text(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise ModelFilesError(f"unsupported special token entry {value!r}")


def load_model_files(directory: Path, chat_template_file: Path | None = None) -> ModelFiles:
    directory = Path(directory)
    tokenizer_path = directory / "tokenizer.json"
    if not tokenizer_path.is_file():
        raise ModelFilesError(f"{tokenizer_path} not found (need a fast-tokenizer tokenizer.json)")
    config_path = directory / "tokenizer_config.json"
    tok_config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    if chat_template_file is not None:
        template = Path(chat_template_file).read_text()
    elif (directory / "chat_template.jinja").is_file():
        template = (directory / "chat_template.jinja").read_text()
    elif isinstance(tok_config.get("chat_template"), str):
        template = tok_config["chat_template"]
    else:
        raise ModelFilesError(f"no chat template in {directory} (pass --chat-template FILE)")
    eos = _token_text(tok_config.get("eos_token"))
    if not eos:
        raise ModelFilesError(f"{config_path}: eos_token is required")
    end_of_turn = _end_of_turn_tokens(directory, tokenizer_path, eos)
    model_config = directory / "config.json"
    config = json.loads(model_config.read_text()) if model_config.is_file() else {}
    vocab = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return ModelFiles(
        tokenizer_path=tokenizer_path,
        chat_template=template,
        bos_token=_token_text(tok_config.get("bos_token")),
        eos_token=eos,
        end_of_turn=end_of_turn,
        context_window=config.get("max_position_embeddings"),
        vocab_size=vocab if isinstance(vocab, int) and vocab > 0 else None,
    )


def _end_of_turn_tokens(directory: Path, tokenizer_path: Path, eos: str) -> list[str]:
    """Every token the model may end a turn with: the tokenizer's EOS plus the stop ids of
    generation_config.json (llama's `<|eom_id|>`, gpt-oss's `<|call|>`/`<|return|>`...),
    so the Gateway can find the end of a reply whichever of them was sampled."""
    markers = [eos]
    path = directory / "generation_config.json"
    if not path.is_file():
        return markers
    ids = json.loads(path.read_text()).get("eos_token_id")
    ids = [ids] if isinstance(ids, int) else ids or []
    if not all(isinstance(i, int) for i in ids):
        raise ModelFilesError(f"{path}: eos_token_id must be an int or a list of ints")
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    for token_id in ids:
        token = tokenizer.id_to_token(token_id)
        if token is None:
            raise ModelFilesError(f"{path}: eos_token_id {token_id} is not in the tokenizer")
        if token not in markers:
            markers.append(token)
    return markers
