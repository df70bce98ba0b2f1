"""hetspec profiles list|show NAME|validate PATH"""

from __future__ import annotations

import yaml

from hwprofiles import list_names, load_model, load_platform, validate_path
from hwprofiles.loader import ProfileError, printable


def register(sub) -> None:
    p = sub.add_parser("profiles", help="list, show or validate hardware and model profiles",
                       description="Shipped platforms and models, and validation of "
                                   "your own YAML files (a platform has 'devices').")
    ps = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    ps.add_parser("list", help="list shipped platforms and models").set_defaults(func=_list)
    show = ps.add_parser("show", help="print a platform or model with derived figures")
    show.add_argument("name", help="a shipped name or a YAML path")
    show.set_defaults(func=_show)
    val = ps.add_parser("validate", help="check a YAML profile file; exit 0 when valid")
    val.add_argument("path")
    val.set_defaults(func=_validate)


def _list(args) -> int:
    for kind in ("platforms", "models"):
        print(f"{kind}:")
        for name in list_names(kind):
            print(f"  {name}")
    return 0


def _show(args) -> int:
    try:
        obj = load_platform(args.name)
    except ProfileError as platform_error:
        try:
            obj = load_model(args.name)
        except ProfileError:
            raise platform_error from None
    data = obj.model_dump(mode="json", exclude={"sources"})
    if hasattr(obj, "layer_bytes"):
        data["derived"] = {"total_params": obj.total_params,
                           "weight_bytes": obj.weight_bytes,
                           "layer_bytes": obj.layer_bytes,
                           "kv_bytes_per_token": obj.kv_bytes_per_token_layer() * obj.n_layers}
    print(yaml.safe_dump(data, sort_keys=False), end="")
    return 0


def _validate(args) -> int:
    obj = validate_path(args.path)
    kind = "platform" if hasattr(obj, "devices") else "model"
    # both strings come from the user's file system and file: no raw escape sequences
    print(f"{printable(args.path)}: valid {kind} '{printable(obj.name)}'")
    return 0
