"""An Anthropic-format upstream that answers every request with one huge
streamed reply: N text deltas of SIZE bytes. For serve_memory.sh.

usage: hostile_upstream.py PORT N SIZE
"""
import socket, threading, sys, json
N = int(sys.argv[2]); SIZE = int(sys.argv[3])
def handle(c):
    buf=b""
    while b"\r\n\r\n" not in buf:
        d=c.recv(65536)
        if not d: return
        buf+=d
    head, rest = buf.split(b"\r\n\r\n",1)
    ln = 0
    for l in head.split(b"\r\n"):
        if l.lower().startswith(b"content-length:"): ln=int(l.split(b":")[1])
    while len(rest)<ln: rest+=c.recv(65536)
    c.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
    c.sendall(b'event: message_start\ndata: {"type":"message_start","message":{"id":"m","type":"message","role":"assistant","model":"x","content":[],"stop_reason":null,"usage":{"input_tokens":1,"output_tokens":1}}}\n\n')
    c.sendall(b'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n')
    delta = ("x"*SIZE)
    frame = ('event: content_block_delta\ndata: ' + json.dumps({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":delta}}) + '\n\n').encode()
    out=[]
    for i in range(N):
        out.append(frame)
        if len(out)==1000:
            c.sendall(b"".join(out)); out=[]
    c.sendall(b"".join(out))
    c.sendall(b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n')
    c.sendall(b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":5}}\n\n')
    c.sendall(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
    c.close()
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR,1); s.bind(("127.0.0.1",int(sys.argv[1]))); s.listen(16)
while True:
    c,_=s.accept(); threading.Thread(target=handle,args=(c,),daemon=True).start()
