"""Domain errors: each carries the HTTP status and the stable `code` of API.md."""


class DomainError(Exception):
    status_code = 400
    code = "invalid"
    default_detail = "The request cannot be carried out."

    def __init__(self, detail: str | None = None):
        self.detail = detail or self.default_detail
        super().__init__(self.detail)


class Conflict(DomainError):
    status_code = 409


class NotSpot(Conflict):
    code = "not_spot"
    default_detail = "Only a spot node can be paused; an on-demand node keeps its promise to renters."


class NodeRented(Conflict):
    code = "node_rented"
    default_detail = "The spot flag cannot change while the node is rented."


class NodeUnavailable(Conflict):
    code = "node_unavailable"
    default_detail = "This node cannot be rented now."


class RentalEnded(Conflict):
    code = "rental_ended"
    default_detail = "This rental has already ended."


class WorkerNotOnNode(DomainError):
    status_code = 403
    code = "worker_not_on_node"
    default_detail = "This agent token acts for one node; the worker belongs to another."


class UnknownModel(DomainError):
    status_code = 400
    code = "unknown_model"
    default_detail = "The platform does not serve this model."


class NotFound(DomainError):
    status_code = 404
    code = "not_found"
    default_detail = "Not found."
