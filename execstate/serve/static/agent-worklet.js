// The microphone's AudioWorklet: the context's rate (44.1 or 48 kHz) -> 16 kHz PCM16, in chunks of
// 20 ms (320 samples) posted to the page. Low-pass first (a 31-tap windowed sinc at 7.2 kHz, the
// anti-alias filter), then linear interpolation at 16 kHz.
class Pcm16Capture extends AudioWorkletProcessor {
  constructor() {
    super();
    this.ratio = sampleRate / 16000;
    const n = 31, fc = 7200 / sampleRate;
    this.taps = new Float32Array(n);
    let sum = 0;
    for (let i = 0; i < n; i++) {
      const x = i - (n - 1) / 2;
      const sinc = x === 0 ? 2 * fc : Math.sin(2 * Math.PI * fc * x) / (Math.PI * x);
      const w = 0.54 - 0.46 * Math.cos((2 * Math.PI * i) / (n - 1));
      this.taps[i] = sinc * w;
      sum += this.taps[i];
    }
    for (let i = 0; i < n; i++) this.taps[i] /= sum;
    this.hist = new Float32Array(n);  // the last n input samples (ring)
    this.h = 0;
    this.filtered = [];  // low-passed input not yet consumed
    this.pos = 0;  // fractional read position in `filtered`
    this.out = new Int16Array(320);
    this.o = 0;
  }
  process(inputs) {
    const ch = inputs[0] && inputs[0][0];
    if (!ch) return true;
    const n = this.taps.length;
    for (let i = 0; i < ch.length; i++) {
      this.hist[this.h] = ch[i];
      this.h = (this.h + 1) % n;
      let acc = 0;
      for (let k = 0; k < n; k++) acc += this.taps[k] * this.hist[(this.h + k) % n];
      this.filtered.push(acc);
    }
    while (this.pos + 1 < this.filtered.length) {
      const i = Math.floor(this.pos), f = this.pos - i;
      const v = this.filtered[i] * (1 - f) + this.filtered[i + 1] * f;
      this.out[this.o++] = Math.max(-32768, Math.min(32767, Math.round(v * 32768)));
      if (this.o === this.out.length) {
        this.port.postMessage(this.out.slice().buffer, []);
        this.o = 0;
      }
      this.pos += this.ratio;
    }
    const drop = Math.floor(this.pos);
    this.filtered = this.filtered.slice(drop);
    this.pos -= drop;
    return true;
  }
}
registerProcessor("pcm16-capture", Pcm16Capture);
