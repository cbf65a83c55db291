"""The trainer's end of the weight-update group: rank 0 listens on ``master_port``, the server's worker connects."""

import socket
from dataclasses import dataclass


@dataclass
class Group:
    store: object
    socket: socket.socket | None


@dataclass
class Communicator:
    group: Group

    def destroy(self) -> None:
        """As vLLM's ``PyNcclCommunicator.destroy`` (``ncclCommAbort``): this end released, no peer waited for."""
        if self.group.socket is not None:
            self.group.socket.close()


def trainer_init(init_info: dict) -> Communicator:
    listener = socket.create_server(("127.0.0.1", init_info["master_port"]), reuse_port=False)
    listener.settimeout(60)
    with listener:
        connection, _ = listener.accept()  # the server, told the port by /init_weight_transfer_engine
    return Communicator(Group(store=None, socket=connection))
