"""hetspec profiles list|show NAME|validate PATH|import CONFIG -o MODEL.yaml"""

from __future__ import annotations

from pathlib import Path

import yaml

from analyses.commands import COMMANDS
from analyses.commands._profileview import (compact, model_line, platform_line, platform_totals,
                                            stack_line)
from analyses.run.outputs import check_outputs
from hwprofiles import list_names, load_model, load_platform, load_stack, validate_path
from hwprofiles.importer import import_config
from hwprofiles.loader import ProfileError, printable
from hwprofiles.writing import atomic_write_text


def register(sub) -> None:
    p = sub.add_parser("profiles",
                       help=COMMANDS["profiles"],
                       description="Shipped platforms, models and software stacks, "
                                   "validation of your own YAML files (a platform has "
                                   "'devices', a stack a stack's fields), and model "
                                   "profiles imported from a checkpoint's config.json.")
    ps = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    ps.add_parser("list", help="list shipped platforms (devices, memory, what they are), "
                  "models (size, layers, dtype) and software stacks (what each adds "
                  "on top of the hardware)").set_defaults(func=_list)
    show = ps.add_parser("show", help="print a platform, model or stack with derived "
                         "figures (alike devices, tiers and links summarised)")
    show.add_argument("name", help="a shipped name or a YAML path")
    show.add_argument("--full", action="store_true",
                      help="every object spelled out, each number with its source")
    show.set_defaults(func=_show)
    val = ps.add_parser("validate", help="check a YAML profile file; exit 0 when valid")
    val.add_argument("path")
    val.set_defaults(func=_validate)
    imp = ps.add_parser("import", help="write a model profile from a Hugging Face "
                        "config.json (Llama, Mistral, Qwen2/3, Gemma/Gemma2, Mixtral, "
                        "Qwen2/3-MoE)")
    imp.add_argument("config", help="path of the checkpoint's config.json")
    imp.add_argument("-o", "--output", help="model YAML to write (default: print it)")
    imp.add_argument("--name", help="the profile's name (default: the output file's "
                     "stem, or the config's folder name)")
    imp.add_argument("--hf-id", help="the checkpoint's Hugging Face id, so that it names "
                     "the profile (e.g. Qwen/Qwen3-32B)")
    imp.add_argument("--weight-bits", type=int, choices=(4, 8, 16, 32),
                     help="stored width of a quantized checkpoint's weights, for a "
                          "quantization_config hetspec does not read (default: its "
                          "gptq/awq bits, bitsandbytes load_in_4bit/8bit, fp8 or "
                          "compressed-tensors num_bits; no quantization_config: the "
                          "dtype's width)")
    imp.set_defaults(func=_import)


def _list(args) -> int:
    for kind, load, line in (("platforms", load_platform, platform_line),
                             ("models", load_model, model_line),
                             ("stacks", load_stack, stack_line)):
        print(f"{kind}:" + (" (calibrated: fitted to measurements by hetspec calibrate; "
                            "datasheet: specification sheets and published figures only, "
                            "to compare with peers' ideal presets; GB = 1e9 bytes)"
                            if kind == "platforms" else ""))
        names = list_names(kind)
        width = max(map(len, names), default=0)
        for name in names:
            print(f"  {name:{width}}  {line(load(name))}")
    return 0


def _show(args) -> int:
    if args.name in list_names("stacks"):
        data = load_stack(args.name).model_dump(mode="json", exclude_unset=not args.full)
        data["sources"] = data.pop("sources", {})  # after the numbers they source
        print(yaml.safe_dump(data, sort_keys=False), end="")
        return 0
    try:
        obj = load_platform(args.name)
    except ProfileError as platform_error:
        try:
            obj = load_model(args.name)
        except ProfileError as model_error:
            if str(platform_error).startswith("unknown platform") and str(
                    model_error).startswith("unknown model"):
                # a name of neither kind (e.g. a Hugging Face id no profile has)
                raise ProfileError(
                    f"'{printable(args.name)}' names no shipped platform or model; see "
                    "'hetspec profiles list' (models also go by their Hugging Face "
                    "ids, e.g. Qwen/Qwen3-32B) or give a path to a YAML file") from None
            raise platform_error from None
    if args.full:
        print(yaml.safe_dump(obj.model_dump(mode="json"), sort_keys=False), end="")
        return 0
    data = compact(obj.model_dump(mode="json"))
    if hasattr(obj, "devices"):
        data["derived"] = platform_totals(obj)
    if hasattr(obj, "layer_bytes"):
        data["derived"] = {"total_params": obj.total_params,
                           "weight_bytes": obj.weight_bytes,
                           "layer_bytes": obj.layer_bytes,
                           "kv_bytes_per_token": obj.kv_bytes_per_token_layer() * obj.n_layers}
        if obj.is_moe:
            data["derived"]["active_params_per_token"] = (
                obj.n_layers * obj.layer_active_params + obj.head_params + obj.embed_params)
    print(yaml.safe_dump(data, sort_keys=False), end="")
    return 0


def _validate(args) -> int:
    obj = validate_path(args.path)
    kind = ("platform" if hasattr(obj, "devices") else "stack"
            if hasattr(obj, "layer_host_s") else "model")
    # both strings come from the user's file system and file: no raw escape sequences
    print(f"{printable(args.path)}: valid {kind} '{printable(obj.name)}'")
    return 0


def _import(args) -> int:
    config = Path(args.config)
    folder_name = config.resolve().parent.name or "imported"
    check_outputs({"-o": args.output}, [("the config.json", config)],
                  names={"-o": f"{args.name or folder_name}.yaml"})
    name = args.name or (Path(args.output).stem if args.output else folder_name)
    fields = import_config(config, name, args.hf_id, args.weight_bits)
    text = yaml.safe_dump(fields, sort_keys=False, allow_unicode=True)
    if args.output is None:
        print(text, end="")
        return 0
    atomic_write_text(args.output, text)
    print(f"{printable(args.output)}: model '{printable(name)}' from "
          f"{printable(args.config)}")
    return 0
