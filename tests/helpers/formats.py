"""A small tar shard written in memory with the format helpers, and the samples it holds."""
import io

from vlmdata.formats import EncodedImage, IndexBuilder, TarShardWriter, write_sample
from vlmdata.text import ByteTokenizer, encode_conversation


def write_shard(samples):
    """A tar shard written with write_sample, in memory: (bytes, its SampleIndex)."""
    tok = ByteTokenizer()
    buf = io.BytesIO()
    writer, builder = TarShardWriter(buf, mtime=0), IndexBuilder()
    for key, text, images in samples:
        tokens = encode_conversation(tok, [("user", ""), ("assistant", text)], len(images))
        imgs = [EncodedImage(data, "jpg", w, h) for data, w, h in images]
        write_sample(writer, builder, key, {"id": key, "text": text}, tokens, imgs, tok.special.image)
    writer.close()
    return buf.getvalue(), builder.build()


SAMPLES = [("a", "first", [(b"\xff\xd8one\xff\xd9", 10, 20)]),
           ("b", "second one", []),
           ("c", "third", [(b"\xff\xd8two\xff\xd9", 30, 40), (b"\xff\xd8three\xff\xd9", 50, 60)])]
