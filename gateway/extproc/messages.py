"""The ext_proc messages the picker reads and writes, as small functions.

Envoy sends header values in `raw_value` (bytes) and reads either field of a
mutation; the picker writes `raw_value` too, as GIE's endpoint picker does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from google.protobuf import struct_pb2

from gateway.errors import APIError, error_body
from gateway.extproc.pb import ext_proc_subset_pb2 as pb

_OVERWRITE = pb.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
# Envoy's ext_proc filter sends the attributes it was told to (request_attributes,
# response_attributes) under its own name.
ATTRIBUTES_NAMESPACE = "envoy.filters.http.ext_proc"


def headers_of(message: pb.HttpHeaders) -> dict[str, str]:
    """Lower-cased names (HTTP/2's, and Envoy's), the last value of each."""
    out: dict[str, str] = {}
    for header in message.headers.headers:
        value = header.raw_value.decode("latin-1") if header.raw_value else header.value
        out[header.key.lower()] = value
    return out


def mutation(set_headers: Mapping[str, str], remove: Iterable[str] = ()) -> pb.HeaderMutation:
    return pb.HeaderMutation(
        set_headers=[
            pb.HeaderValueOption(
                header=pb.HeaderValue(key=k, raw_value=v.encode("latin-1")),
                append_action=_OVERWRITE,
            )
            for k, v in set_headers.items()
        ],
        remove_headers=list(remove),
    )


def common(
    set_headers: Mapping[str, str] | None = None,
    *,
    remove: Iterable[str] = (),
    body: bytes | None = None,
    clear_route_cache: bool = False,
) -> pb.CommonResponse:
    """CONTINUE, with header and body changes if any (an empty body is a clear)."""
    response = pb.CommonResponse(clear_route_cache=clear_route_cache)
    if set_headers or remove:
        response.header_mutation.CopyFrom(mutation(set_headers or {}, remove))
    if body is not None:
        if body:
            response.body_mutation.body = body
        else:
            response.body_mutation.clear_body = True
    return response


def request_headers_reply(response: pb.CommonResponse | None = None) -> pb.ProcessingResponse:
    return pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(response=response or pb.CommonResponse())
    )


def unrouted_reply() -> pb.ProcessingResponse:
    """The request headers of a request the picker does not route (/v1/models, /health):
    Envoy is told to send nothing more of it (no answer's headers or body), one message
    instead of three. Envoy honours it where the filter has allow_mode_override
    (deploy/envoy/envoy.yaml); elsewhere it is ignored and the picker passes the rest."""
    reply = request_headers_reply()
    reply.mode_override.response_header_mode = pb.ProcessingMode.SKIP
    reply.mode_override.response_body_mode = pb.ProcessingMode.NONE
    return reply


def request_body_reply(
    response: pb.CommonResponse | None = None, metadata: struct_pb2.Struct | None = None
) -> pb.ProcessingResponse:
    reply = pb.ProcessingResponse(
        request_body=pb.BodyResponse(response=response or pb.CommonResponse())
    )
    if metadata is not None:
        reply.dynamic_metadata.CopyFrom(metadata)
    return reply


def response_headers_reply(response: pb.CommonResponse | None = None) -> pb.ProcessingResponse:
    return pb.ProcessingResponse(
        response_headers=pb.HeadersResponse(response=response or pb.CommonResponse())
    )


def bodiless_answer_reply(response: pb.CommonResponse) -> pb.ProcessingResponse:
    """The answer's headers, with Envoy told to send none of its body: one message fewer
    for an answer whose body the picker does not read (an error's). Honoured where the
    filter has allow_mode_override, as unrouted_reply is; elsewhere the body comes, and
    the picker passes it."""
    reply = response_headers_reply(response)
    reply.mode_override.response_body_mode = pb.ProcessingMode.NONE
    return reply


# The reply to an answer's chunk that passes unchanged, built once: a streamed answer's
# chunks then build nothing (a new one was 6 us a chunk). Shared, so never changed after.
_CHUNK_PASSES = pb.ProcessingResponse(response_body=pb.BodyResponse(response=pb.CommonResponse()))


def response_body_reply(response: pb.CommonResponse | None = None) -> pb.ProcessingResponse:
    if response is None:
        return _CHUNK_PASSES
    return pb.ProcessingResponse(response_body=pb.BodyResponse(response=response))


def trailers_reply(request: bool) -> pb.ProcessingResponse:
    if request:
        return pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
    return pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


def immediate(error: APIError, headers: Mapping[str, str]) -> pb.ProcessingResponse:
    """The gateway's error, in OpenAI's shape, answered by Envoy without a backend."""
    body = error_body(error.status, error.message, param=error.param, code=error.code)
    sent = {"content-type": "application/json", **headers, **(error.headers or {})}
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=pb.HttpStatus(code=error.status),
            headers=mutation(sent),
            body=body,
            details=f"specroute_{error.code or error.status}",
        )
    )


def lb_metadata(fields: Mapping[str, str], namespace: str = "envoy.lb") -> struct_pb2.Struct:
    """Dynamic metadata {namespace: {key: value}}, as GIE's protocol puts the endpoint."""
    metadata = struct_pb2.Struct()
    metadata.get_or_create_struct(namespace).update(dict(fields))
    return metadata


def attribute(message: pb.ProcessingRequest, name: str) -> str | None:
    """An Envoy attribute the filter sent with this message (response_attributes)."""
    if ATTRIBUTES_NAMESPACE not in message.attributes:
        return None
    fields = message.attributes[ATTRIBUTES_NAMESPACE].fields
    if name not in fields:
        return None
    value = fields[name]
    return value.string_value if value.HasField("string_value") else None


def served_endpoint(message: pb.ProcessingRequest) -> str | None:
    """GIE's `x-gateway-destination-endpoint-served`, where the gateway reports it."""
    namespaces = message.metadata_context.filter_metadata
    if "envoy.lb" not in namespaces:
        return None
    fields = namespaces["envoy.lb"].fields
    key = "x-gateway-destination-endpoint-served"
    return fields[key].string_value if key in fields else None
