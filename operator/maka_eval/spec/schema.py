"""Kubernetes structural schemas (OpenAPI v3) generated from the spec models.

The CRD schema comes from the same pydantic models that validate documents (one source
of truth). pydantic emits JSON Schema 2020-12; a CRD needs a *structural* schema: no
`$ref`, a type on every node, no `anyOf`/`oneOf` standing in for a type, `nullable`
instead of a null member, OpenAPI's boolean `exclusiveMinimum`, and no `title`.
Discriminated unions (the subjects' `kind`) become one object whose properties are the
union of the variants'; what that loses (which fields each kind needs) is listed in
`rules.CROSS_FIELD_RULES` and checked by the loader.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

Schema = dict[str, Any]

_VALUE_KEYWORDS = (
    "type",
    "format",
    "enum",
    "pattern",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "nullable",
    "default",
)
_KEPT = {*_VALUE_KEYWORDS, "description", "required", "properties", "items", "additionalProperties"}
_DROPPED = {"title", "discriminator", "propertyNames"}
"""`propertyNames` (map-key rules) has no structural equivalent; see CROSS_FIELD_RULES."""


class SchemaError(ValueError):
    """A model uses a construct a Kubernetes structural schema cannot express."""


def structural_schema(model: type[BaseModel]) -> Schema:
    """The structural OpenAPI v3 schema of `model`, ready for a CRD's openAPIV3Schema."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    definitions = raw.pop("$defs", {})
    return _Converter(definitions).convert(raw, model.__name__)


class _Converter:
    def __init__(self, definitions: dict[str, Schema]) -> None:
        self.definitions = definitions

    def _resolve(self, node: Schema, where: str) -> Schema:
        """`node` with a `$ref` replaced by the definition; the node's own keys win."""
        ref = node.get("$ref")
        if ref is None:
            return node
        name = str(ref).removeprefix("#/$defs/")
        if name not in self.definitions:
            raise SchemaError(f"{where}: unknown reference {ref}")
        resolved = copy.deepcopy(self.definitions[name])
        resolved.update({k: v for k, v in node.items() if k != "$ref"})
        return self._resolve(resolved, where)

    def convert(self, node: Schema, where: str) -> Schema:
        """One node, its children converted too."""
        node = self._resolve(node, where)
        for union in ("anyOf", "oneOf"):
            if union in node:
                return self._union(node, union, where)
        if "allOf" in node or "not" in node or "prefixItems" in node:
            raise SchemaError(f"{where}: allOf/not/fixed-length tuples have no CRD form")

        out: Schema = {}
        for key, value in node.items():
            if key in _DROPPED:
                continue
            if key == "const":
                out["enum"] = [value]
            elif key == "properties":
                out["properties"] = {
                    name: self.convert(child, f"{where}.{name}") for name, child in value.items()
                }
            elif key == "items":
                out["items"] = self.convert(value, f"{where}[]")
            elif key == "additionalProperties":
                if value is False:
                    continue  # unknown fields are pruned; the loader refuses them
                if value is True or value == {}:
                    out["x-kubernetes-preserve-unknown-fields"] = True
                else:
                    out["additionalProperties"] = self.convert(value, f"{where}.*")
            elif key == "patternProperties":
                if len(value) != 1:
                    raise SchemaError(f"{where}: several key patterns have no CRD form")
                (child,) = value.values()
                out["additionalProperties"] = self.convert(child, f"{where}.*")
            elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
                # JSON Schema 2020-12 gives the bound; OpenAPI v3.0 a flag on min/max.
                bound = "minimum" if key == "exclusiveMinimum" else "maximum"
                out[bound] = value
                out[key] = True
            elif key == "default" and value is None:
                continue  # "absent" already means None
            elif key in _KEPT or key.startswith("x-kubernetes-"):
                out[key] = value
            else:
                raise SchemaError(f"{where}: keyword '{key}' has no CRD form")

        if "type" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            if node.get("properties") is not None or "additionalProperties" in node:
                out["type"] = "object"
            else:  # Any: keep whatever is there
                out["x-kubernetes-preserve-unknown-fields"] = True
        if out.get("type") == "object":
            if "additionalProperties" in out and "properties" in out:
                raise SchemaError(f"{where}: both fixed and free-form keys have no CRD form")
            if "additionalProperties" not in out and "properties" not in out:
                out["properties"] = {}
            if "x-kubernetes-preserve-unknown-fields" in out:
                out.pop("additionalProperties", None)
        return out

    def _union(self, node: Schema, union: str, where: str) -> Schema:
        members = [self._resolve(m, where) for m in node[union]]
        nullable = any(m.get("type") == "null" for m in members)
        rest = [m for m in members if m.get("type") != "null"]
        outer = {k: v for k, v in node.items() if k not in (union, "discriminator", "title")}
        if len(rest) == 1:
            merged = {**rest[0], **outer}
            result = self.convert(merged, where)
        elif all(m.get("type") == "object" for m in rest):
            tag = (node.get("discriminator") or {}).get("propertyName")
            if not tag:
                raise SchemaError(f"{where}: a union of objects needs a discriminator")
            variants = [self.convert(m, where) for m in rest]
            result = _merge_variants(variants, tag, where)
            result.update(self.convert(outer, where) if outer else {})
            result.pop("x-kubernetes-preserve-unknown-fields", None)
        else:
            raise SchemaError(f"{where}: a union of different types has no CRD form")
        if nullable:
            result["nullable"] = True
        return result


def _tag_values(variant: Schema, tag: str, where: str) -> list[Any]:
    values = variant.get("properties", {}).get(tag, {}).get("enum")
    if not values:
        raise SchemaError(f"{where}: a variant has no fixed '{tag}'")
    return list(values)


def _merge_variants(variants: list[Schema], tag: str, where: str) -> Schema:
    """One object schema accepting every variant; `tag` lists every variant's value."""
    tags = [value for variant in variants for value in _tag_values(variant, tag, where)]
    merged = _merge_objects(variants, where, skip=tag)
    first_tag = variants[0]["properties"][tag]
    merged["properties"] = {tag: {**first_tag, "enum": tags}, **merged["properties"]}
    return merged


def _merge_objects(schemas: list[Schema], where: str, skip: str | None = None) -> Schema:
    out: Schema = {"type": "object", "properties": {}}
    descriptions = [s["description"] for s in schemas if "description" in s]
    if descriptions:
        out["description"] = " / ".join(dict.fromkeys(descriptions))
    names = list(dict.fromkeys(n for s in schemas for n in s.get("properties", {})))
    for name in names:
        if name == skip:
            continue
        present = [s["properties"][name] for s in schemas if name in s.get("properties", {})]
        merged = _merge(present, f"{where}.{name}")
        if len(present) < len(schemas) and "default" in merged:
            # The API server would fill it into every variant, also those without it.
            merged = {k: v for k, v in merged.items() if k != "default"}
        out["properties"][name] = merged
    required = set.intersection(*(set(s.get("required", [])) for s in schemas))
    if required:
        out["required"] = [n for n in names if n in required]
    return out


def _merge(schemas: list[Schema], where: str) -> Schema:
    """One schema for a property several variants declare; they must agree on values."""
    if len(schemas) == 1:
        return schemas[0]
    for key in _VALUE_KEYWORDS:
        values = [s.get(key) for s in schemas]
        if any(v != values[0] for v in values):
            raise SchemaError(
                f"{where}: the variants disagree on '{key}' ({values}); rename one of them"
            )
    if schemas[0].get("type") == "object" and any("properties" in s for s in schemas):
        merged = _merge_objects(schemas, where)
        for key in _VALUE_KEYWORDS:
            if key in schemas[0]:
                merged[key] = schemas[0][key]
        return merged
    out = dict(schemas[0])
    descriptions = [s["description"] for s in schemas if "description" in s]
    if descriptions:
        out["description"] = " / ".join(dict.fromkeys(descriptions))
    if "items" in out:
        out["items"] = _merge([s["items"] for s in schemas], f"{where}[]")
    if "additionalProperties" in out:
        out["additionalProperties"] = _merge(
            [s["additionalProperties"] for s in schemas], f"{where}.*"
        )
    return out
