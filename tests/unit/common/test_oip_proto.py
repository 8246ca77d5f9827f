"""proto/qveil/oip/grpc_predict_v2.proto against the upstream texts it claims to be.

The upstream files are vendored in tests/data/oip/ (source URLs and commits in its README):
the Open Inference Protocol's open_inference_grpc.proto whole, and an excerpt of Triton's
grpc_service.proto (the model-repository RPCs and messages). Each is compiled here with protoc
(grpc_tools) into a FileDescriptorProto, never loaded into protobuf's pool (both define
`inference.*`, as the stubs do), and compared with the descriptor compiled into
``qveil.oip.grpc_predict_v2_pb2``: every RPC (name, request and response types, streaming),
every message and every field (name, number, type, label, message type, oneof)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from qveil.oip import grpc_predict_v2_pb2 as pb

DATA = Path(__file__).resolve().parents[2] / "data" / "oip"
PROTO = Path(__file__).resolve().parents[3] / "proto" / "qveil" / "oip" / "grpc_predict_v2.proto"
OIP = "open_inference_grpc.proto"
TRITON = "triton_grpc_service_repository.proto"
#: what qveil takes from Triton's file: the repository RPCs and their messages
TRITON_RPCS = {"RepositoryModelLoad", "RepositoryModelUnload"}
TRITON_MESSAGES = {
    "ModelRepositoryParameter",
    "RepositoryModelLoadRequest",
    "RepositoryModelLoadResponse",
    "RepositoryModelUnloadRequest",
    "RepositoryModelUnloadResponse",
}
OIP_COMMIT = "d49cc23f89d709d87b210ef9449e273ae243984e"
TRITON_COMMIT = "83adf7cf88a2f343005974dff3728be746de2d66"


def compiled(name: str, tmp: Path) -> descriptor_pb2.FileDescriptorProto:
    """The upstream file ``name`` compiled by protoc (not registered anywhere)."""
    out = tmp / (name + ".pb")
    rc = protoc.main(["protoc", f"-I{DATA}", f"--descriptor_set_out={out}", str(DATA / name)])
    assert rc == 0, name
    (fd,) = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    return fd


def ours() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(fd)
    return fd


def messages(fd: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    """Message name (nested ones dotted, map entries included) -> its fields, sorted."""
    out: dict[str, Any] = {}

    def walk(msgs: Any, prefix: str) -> None:
        for m in msgs:
            name = prefix + m.name
            oneofs = [o.name for o in m.oneof_decl]
            out[name] = sorted(
                (
                    f.name,
                    f.number,
                    f.type,
                    f.label,
                    f.type_name,
                    oneofs[f.oneof_index] if f.HasField("oneof_index") else None,
                )
                for f in m.field
            ) + [("map_entry", m.options.map_entry)]
            walk(m.nested_type, name + ".")

    walk(fd.message_type, "")
    return out


def rpcs(fd: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    (svc,) = fd.service
    return {
        m.name: (m.input_type, m.output_type, m.client_streaming, m.server_streaming)
        for m in svc.method
    }


def test_vendored_proto_is_the_oip_file_plus_tritons_repository_messages(
    tmp_path: Path,
) -> None:
    oip, triton, mine = compiled(OIP, tmp_path), compiled(TRITON, tmp_path), ours()
    assert mine.package == oip.package == triton.package == "inference"
    assert mine.syntax == oip.syntax == "proto3"
    assert not mine.dependency
    assert [s.name for s in mine.service] == ["GRPCInferenceService"]
    m_oip, m_triton, m_mine = messages(oip), messages(triton), messages(mine)
    # every OIP message, field for field
    for name, fields in m_oip.items():
        assert m_mine.get(name) == fields, name
    # Triton's repository messages, field for field (its RepositoryIndex* are not taken)
    taken = {n for n in m_triton if n.split(".")[0] in TRITON_MESSAGES}
    for name in taken:
        assert m_mine.get(name) == m_triton[name], name
    assert set(m_mine) == set(m_oip) | taken  # nothing else
    # the RPCs: the OIP service's, then Triton's two, with the same types
    r_oip, r_triton, r_mine = rpcs(oip), rpcs(triton), rpcs(mine)
    assert set(r_triton) == TRITON_RPCS
    assert r_mine == {**r_oip, **r_triton}


def test_the_fields_the_protocol_added_are_there_with_its_numbers() -> None:
    """What an older copy lacked: ModelMetadataResponse.properties (map<string, string> = 6),
    InferParameter.double_param = 4 and uint64_param = 5 in the oneof; Triton's repository
    request numbering (repository_name = 1, model_name = 2, parameters = 3)."""
    md = pb.ModelMetadataResponse.DESCRIPTOR.fields_by_name["properties"]
    assert md.number == 6 and md.message_type.GetOptions().map_entry
    assert md.message_type.fields_by_name["value"].type == md.TYPE_STRING
    p = pb.InferParameter.DESCRIPTOR
    assert {f.name: f.number for f in p.oneofs_by_name["parameter_choice"].fields} == {
        "bool_param": 1,
        "int64_param": 2,
        "string_param": 3,
        "double_param": 4,
        "uint64_param": 5,
    }
    for req in (pb.RepositoryModelLoadRequest, pb.RepositoryModelUnloadRequest):
        nums = {f.name: f.number for f in req.DESCRIPTOR.fields}
        assert nums == {"repository_name": 1, "model_name": 2, "parameters": 3}
    # what a client writes decodes as the protocol says
    msg = pb.InferParameter(uint64_param=2**64 - 1)
    assert msg.SerializeToString() == b"\x28" + b"\xff" * 9 + b"\x01"
    assert pb.InferParameter.FromString(b"\x21" + b"\0" * 7 + b"\x40").double_param == 2.0


def test_header_names_the_upstream_revisions_it_matches() -> None:
    """The header's claims are the ones tested above: the same repositories and commits as
    tests/data/oip/README.md, and the vendored texts carry no other revision."""
    text = PROTO.read_text()
    header = text[: text.index('syntax = "proto3";')]
    readme = (DATA / "README.md").read_text()
    for commit in (OIP_COMMIT, TRITON_COMMIT):
        assert commit in header and commit in readme
    assert "kserve/open-inference-protocol" in header
    assert "triton-inference-server/common" in header
    assert set(re.findall(r"\b[0-9a-f]{40}\b", header)) == {OIP_COMMIT, TRITON_COMMIT}


@pytest.mark.parametrize("name", [OIP, TRITON])
def test_every_upstream_line_is_in_the_vendored_proto_in_order(name: str) -> None:
    """Verbatim: each non-blank line of the upstream text from `syntax` on (comments too)
    appears in grpc_predict_v2.proto in the same order, but for Triton's messages qveil does
    not take (RepositoryIndex*) and the lines around the excerpt's service."""
    lines = [ln for ln in (DATA / name).read_text().splitlines() if ln.strip()]
    body = lines[next(i for i, ln in enumerate(lines) if ln.startswith("syntax")) :]
    if name == TRITON:
        body = _without_repository_index(body)
        body = [ln for ln in body if not ln.startswith("// qveil")]
    mine = iter(ln for ln in PROTO.read_text().splitlines() if ln.strip())
    missing = [ln for ln in body if not any(m == ln for m in mine)]
    assert missing == [], missing[:5]


def _without_repository_index(lines: list[str]) -> list[str]:
    """Triton's excerpt without the excerpt's own comment, its `service {` wrapper and
    RepositoryIndex{Request,Response} (with the //@@ comment above each)."""
    out: list[str] = []
    skip = False
    pending: list[str] = []
    for ln in lines:
        if ln.startswith("//@@") and not ln.startswith("  "):
            pending.append(ln)
            continue
        if ln.startswith("message "):
            skip = ln.split()[1] in ("RepositoryIndexRequest", "RepositoryIndexResponse")
        if ln.startswith("// qveil") or (ln.startswith("//") and not ln.startswith("//@@")):
            continue
        if not skip:
            out += pending
        pending = []
        if not skip:
            out.append(ln)
    return out + pending
