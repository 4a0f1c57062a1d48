/**
 * Our CM codecs against Wireshark's on real rdma_cm traffic (rping over rdma_rxe) and on MADs we
 * emit ourselves (REJ, MRA and every bit field set, which the capture does not have): every field
 * our parse returns equals what `tshark -T json` shows for it. Needs tshark; fails without it.
 *
 * Wireshark 4.0 reads the REQ's "flow label(20) reserved(6) packet rate(6)" word wrongly: it
 * shows the top 12 bits of the flow label as the flow label, and takes reserved and packet rate
 * from the word's first byte. The expectations below reproduce that reading from our record, so
 * the test still pins every bit.
 */

import t, { type Test } from 'tap';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { MAD_HEADER_LEN, type MadHeader } from '../../src/cm/mad.js';
import {
  cmaHeaderFor,
  cmMadBytes,
  cmMadHeader,
  gidOfIp,
  parseCmaHeader,
  parseCmMad,
  reqPrivateData,
  type CmMad,
  type CmMessage,
  type CmPath,
} from '../../src/cm/messages.js';
import { formatIpAddress } from '../../src/wire/frame.js';
import { emitPacket } from '../../src/wire/packet.js';
import { GSI_QKEY } from '../../src/wire/constants.js';
import { PcapWriter } from '../../src/pcap/writer.js';
import { rpingMads, RPING_PCAP } from '../cm/rping.js';
import { tsharkJson, flatten } from './tshark.js';


const colons = (b: Uint8Array): string => [...b].map((x) => x.toString(16).padStart(2, '0')).join(':');

function check(t: Test, where: string, ws: Map<string, string>, want: Record<string, number | bigint | boolean | string>): void {
  for (const [field, v] of Object.entries(want)) {
    const got = ws.get(field);
    if (got === undefined) {
      t.fail(`${where}: tshark shows no ${field}`);
      continue;
    }
    if (typeof v === 'string') t.equal(got, v, `${where} ${field}`);
    else if (typeof v === 'bigint') t.equal(BigInt(got), v, `${where} ${field}`);
    else t.equal(Number(got), typeof v === 'boolean' ? +v : v, `${where} ${field}`);
  }
}

function headerFields(h: MadHeader, data: Uint8Array): Record<string, number | bigint | string> {
  return {
    'infiniband.mad.baseversion': h.baseVersion,
    'infiniband.mad.mgmtclass': h.mgmtClass,
    'infiniband.mad.classversion': h.classVersion,
    'infiniband.mad.method': (h.response ? 0x80 : 0) | h.method,
    'infiniband.mad.status': h.status,
    'infiniband.mad.classspecific': h.classSpecific,
    'infiniband.mad.transactionid': h.transactionId,
    'infiniband.mad.attributeid': h.attributeId,
    'infiniband.mad.attributemodifier': h.attributeModifier,
    'infiniband.mad.data': colons(data),
  };
}

/** Wireshark 4.0's reading of a REQ path's flow-label word (see the file comment). */
function pathFields(prefix: 'prim' | 'alt', p: CmPath, ipCm: boolean): Record<string, number | bigint | string> {
  const firstByte = p.flowLabel >>> 12;
  const o: Record<string, number | bigint | string> = {
    [`infiniband.cm.req.${prefix}_locallid`]: p.localLid,
    [`infiniband.cm.req.${prefix}_remotelid`]: p.remoteLid,
    [`infiniband.cm.req.${prefix}_flowlabel`]: p.flowLabel >>> 8,
    [`infiniband.cm.req.${prefix}_reserved0`]: firstByte >>> 6,
    [`infiniband.cm.req.${prefix}_pktrate`]: firstByte & 0x3f,
    [`infiniband.cm.req.${prefix}_tfcclass`]: p.trafficClass,
    [`infiniband.cm.req.${prefix}_hoplim`]: p.hopLimit,
    [`infiniband.cm.req.${prefix}_sl`]: p.sl,
    [`infiniband.cm.req.${prefix}_subnetlocal`]: +p.subnetLocal,
    [`infiniband.cm.req.${prefix}_localacktout`]: p.localAckTimeout,
  };
  // For a REQ to an IP CM service ID (0x0000000001xxxxxx), Wireshark 4.0 shows the primary GIDs
  // as IPv4 addresses made of their last 4 bytes, whatever the GID (an IPv6 one included).
  if (prefix === 'prim' && ipCm) {
    o['infiniband.cm.req.prim_localgid_ipv4'] = formatIpAddress(p.localGid.subarray(12));
    o['infiniband.cm.req.prim_remotegid_ipv4'] = formatIpAddress(p.remoteGid.subarray(12));
  } else {
    o[`infiniband.cm.req.${prefix}_localgid`] = prefix === 'prim' ? formatIpAddress(p.localGid) : colons(p.localGid);
    o[`infiniband.cm.req.${prefix}_remotegid`] = prefix === 'prim' ? formatIpAddress(p.remoteGid) : colons(p.remoteGid);
  }
  return o;
}

function messageFields(m: CmMessage): Record<string, number | bigint | string> {
  switch (m.kind) {
    case 'REQ': {
      const ipCm = (m.serviceId & 0xffffffffff000000n) === 0x0000000001000000n;
      const o: Record<string, number | bigint | string> = {
        'infiniband.cm.req': m.localCommId,
        'infiniband.cm.req.serviceid': m.serviceId,
        'infiniband.cm.req.localcaguid': m.localCaGuid,
        'infiniband.cm.req.localqkey': m.localQkey,
        'infiniband.cm.req.localqpn': m.localQpn,
        'infiniband.cm.req.responderres': m.responderResources,
        'infiniband.cm.req.localeecn': m.localEecn,
        'infiniband.cm.req.initdepth': m.initiatorDepth,
        'infiniband.cm.req.remoteeecn': m.remoteEecn,
        'infiniband.cm.req.remoteresptout': m.remoteCmResponseTimeout,
        'infiniband.cm.req.transpsvctype': m.transportServiceType,
        'infiniband.cm.req.e2eflowctrl': +m.endToEndFlowControl,
        'infiniband.cm.req.startpsn': m.startingPsn,
        'infiniband.cm.req.localresptout': m.localCmResponseTimeout,
        'infiniband.cm.req.retrcount': m.retryCount,
        'infiniband.cm.req.pkey': m.pkey,
        'infiniband.cm.req.pppmtu': m.pathMtu,
        'infiniband.cm.req.rdcexist': +m.rdcExists,
        'infiniband.cm.req.rnrretrcount': m.rnrRetryCount,
        'infiniband.cm.req.maxcmretr': m.maxCmRetries,
        'infiniband.cm.req.srq': +m.srq,
        'infiniband.cm.req.ext_transport': m.extendedTransportType,
        ...pathFields('prim', m.primaryPath, ipCm),
        ...pathFields('alt', m.alternatePath, ipCm),
      };
      const cma = parseCmaHeader(m.privateData);
      if (cma.ok) {
        const h = cma.header;
        Object.assign(o, {
          'infiniband.cm.req.ip_cm.majv': h.majorVersion,
          'infiniband.cm.req.ip_cm.minv': h.minorVersion,
          'infiniband.cm.req.ip_cm.ipv': h.ipVersion,
          'infiniband.cm.req.ip_cm.sport': h.srcPort,
          'infiniband.cm.req.ip_cm.private': colons(cma.userData),
        });
        if (h.ipVersion === 4) {
          o['infiniband.cm.req.ip_cm.sip4'] = formatIpAddress(h.srcIp.subarray(12));
          o['infiniband.cm.req.ip_cm.dip4'] = formatIpAddress(h.dstIp.subarray(12));
        } else {
          o['infiniband.cm.req.ip_cm.sip6'] = formatIpAddress(h.srcIp);
          o['infiniband.cm.req.ip_cm.dip6'] = formatIpAddress(h.dstIp);
        }
      }
      return o;
    }
    case 'REP':
      return {
        'infiniband.cm.rep': m.localCommId,
        'infiniband.cm.rep.remotecommid': m.remoteCommId,
        'infiniband.cm.rep.localqkey': m.localQkey,
        'infiniband.cm.rep.localqpn': m.localQpn,
        'infiniband.cm.rep.localeecn': m.localEecn,
        'infiniband.cm.rep.startpsn': m.startingPsn,
        'infiniband.cm.rep.respres': m.responderResources,
        'infiniband.cm.rep.initdepth': m.initiatorDepth,
        'infiniband.cm.rep.tgtackdelay': m.targetAckDelay,
        'infiniband.cm.rep.failoveracc': m.failoverAccepted,
        'infiniband.cm.rep.e2eflowctrl': +m.endToEndFlowControl,
        'infiniband.cm.rep.rnrretrcount': m.rnrRetryCount,
        'infiniband.cm.rep.srq': +m.srq,
        'infiniband.cm.rep.localcaguid': m.localCaGuid,
        'infiniband.cm.rep.private': colons(m.privateData),
      };
    case 'RTU':
      return { 'infiniband.cm.rtu.localcommid': m.localCommId, 'infiniband.cm.rtu.remotecommid': m.remoteCommId, 'infiniband.cm.rtu.private': colons(m.privateData) };
    case 'DREQ':
      return {
        'infiniband.cm.dreq.localcommid': m.localCommId,
        'infiniband.cm.dreq.remotecommid': m.remoteCommId,
        // Wireshark 4.0 files the DREQ's Remote QPN/EECN under a REQ field name.
        'infiniband.cm.req.remoteqpneecn': m.remoteQpn,
        'infiniband.cm.dreq.private': colons(m.privateData),
      };
    case 'DREP':
      return { 'infiniband.cm.drsp.localcommid': m.localCommId, 'infiniband.cm.drsp.remotecommid': m.remoteCommId, 'infiniband.cm.drsp.private': colons(m.privateData) };
    case 'REJ':
      return {
        'infiniband.cm.rej.localcommid': m.localCommId,
        'infiniband.cm.rej.remotecommid': m.remoteCommId,
        'infiniband.cm.rej.msgrej': m.messageRejected,
        'infiniband.cm.rej.rejinfolen': m.rejectedInfoLength,
        'infiniband.cm.rej.reason': m.reason,
        'infiniband.cm.rej.ari': colons(m.ari),
        'infiniband.cm.rej.private': colons(m.privateData),
      };
    case 'MRA':
      // Wireshark 4.0 dissects no MRA fields; the header and data bytes are compared.
      return {};
  }
}

function compareFrame(t: Test, where: string, mad: CmMad, bytes: Uint8Array, ws: Map<string, string>): void {
  check(t, where, ws, { 'infiniband.bth.destqp': 1, 'infiniband.deth.q_key': GSI_QKEY, 'infiniband.deth.srcqp': 1 });
  check(t, where, ws, headerFields(mad.header, bytes.subarray(MAD_HEADER_LEN)));
  check(t, where, ws, messageFields(mad.msg));
}

t.test('rping.pcap: every CM MAD as tshark shows it', async (t) => {
  const frames = await tsharkJson(RPING_PCAP, ['-Y', 'infiniband.bth.destqp == 1']);
  const byNumber = new Map<number, Map<string, string>>();
  for (const f of frames) {
    const layers = f._source.layers;
    byNumber.set(Number(layers.frame['frame.number']), flatten(layers.infiniband));
  }
  const mads = rpingMads();
  t.equal(mads.length, 5);
  t.same([...byNumber.keys()], mads.map((m) => m.frame), 'tshark and we find the same CM frames');
  for (const m of mads) {
    const r = parseCmMad(m.mad);
    if (!r.ok) {
      t.fail(`frame ${m.frame}: ${r.error}`);
      continue;
    }
    compareFrame(t, `frame ${m.frame} ${r.mad.msg.kind}`, r.mad, m.mad, byNumber.get(m.frame) ?? new Map());
  }
});

t.test('MADs we emit (REJ, MRA, IPv6 REQ, every bit field set) as tshark shows them', async (t) => {
  const pd = (n: number): Uint8Array => new Uint8Array(n).map((_, i) => 0xa0 + (i % 16));
  const path = (a: string, b: string, k: number): CmPath => ({
    localLid: 0x1234 + k, remoteLid: 0x5678 + k, localGid: gidOfIp(a), remoteGid: gidOfIp(b), flowLabel: 0xabcde - k, packetRate: 0x2a + k,
    trafficClass: 0x88 + k, hopLimit: 0x40 + k, sl: 0xb - k, subnetLocal: k === 0, localAckTimeout: 0x13 + k,
  });
  const mads: CmMad[] = [
    {
      header: { ...cmMadHeader('REQ', 0xfedcba9876543210n), attributeModifier: 0x01020304 },
      msg: {
        kind: 'REQ', localCommId: 0xdeadbeef, serviceId: 0x1061c06n, localCaGuid: 0x0123456789abcdefn, localQkey: 0x11111111,
        localQpn: 0xabcdef, responderResources: 0x10, localEecn: 0x123456, initiatorDepth: 0x20, remoteEecn: 0x654321,
        remoteCmResponseTimeout: 0x17, transportServiceType: 1, endToEndFlowControl: true, startingPsn: 0xfedcba,
        localCmResponseTimeout: 0x0b, retryCount: 5, pkey: 0x7fff, pathMtu: 5, rdcExists: true, rnrRetryCount: 3,
        maxCmRetries: 9, srq: true, extendedTransportType: 0, primaryPath: path('fd77::3', 'fd77::2', 0),
        alternatePath: path('fd77::13', 'fd77::12', 1), sapSupported: false,
        privateData: reqPrivateData(cmaHeaderFor('fd77::3', 40000, 'fd77::2'), pd(56)),
      },
    },
    {
      header: cmMadHeader('REP', 7n),
      msg: {
        kind: 'REP', localCommId: 1, remoteCommId: 2, localQkey: 3, localQpn: 0x400004, localEecn: 0x500005, startingPsn: 0x600006,
        responderResources: 7, initiatorDepth: 8, targetAckDelay: 0x1e, failoverAccepted: 2, endToEndFlowControl: true,
        rnrRetryCount: 6, srq: true, localCaGuid: 0x1122334455667788n, privateData: pd(196),
      },
    },
    { header: cmMadHeader('REJ', 8n), msg: { kind: 'REJ', localCommId: 0, remoteCommId: 0xdeadbeef, messageRejected: 0, rejectedInfoLength: 8, reason: 8, ari: pd(72).map((x) => x ^ 0xff), privateData: pd(148) } },
    { header: cmMadHeader('REJ', 9n), msg: { kind: 'REJ', localCommId: 3, remoteCommId: 4, messageRejected: 1, rejectedInfoLength: 0, reason: 28, ari: new Uint8Array(72), privateData: pd(3) } },
    { header: cmMadHeader('MRA', 10n), msg: { kind: 'MRA', localCommId: 5, remoteCommId: 6, messageMraed: 1, serviceTimeout: 0x17, privateData: pd(222) } },
    { header: cmMadHeader('RTU', 11n), msg: { kind: 'RTU', localCommId: 7, remoteCommId: 8, privateData: pd(224) } },
    { header: cmMadHeader('DREQ', 12n), msg: { kind: 'DREQ', localCommId: 9, remoteCommId: 10, remoteQpn: 0xc0ffee, privateData: pd(220) } },
    { header: cmMadHeader('DREP', 13n), msg: { kind: 'DREP', localCommId: 11, remoteCommId: 12, privateData: pd(224) } },
  ];
  const dir = mkdtempSync(join(tmpdir(), 'roce-cm-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const file = join(dir, 'cm.pcap');
  const chunks: Uint8Array[] = [];
  const w = new PcapWriter((c) => chunks.push(c));
  const emitted = mads.map((m, i) => {
    const bytes = cmMadBytes(m);
    const udp = new Uint8Array(12 + 8 + bytes.length + 4);
    emitPacket(
      {
        bth: { opcode: 0x64, se: false, m: false, padCount: 0, tver: 0, pkey: 0xffff, fecn: false, becn: false, resv6: 0, destQp: 1, ackReq: false, resv7: 0, psn: i },
        deth: { qkey: GSI_QKEY, srcQp: 1 },
        payload: bytes,
        icrc: 0,
      },
      udp,
    );
    w.writeRoce(BigInt(i) * 1000n, { src: new Uint8Array([10, 77, 0, 3]), dst: new Uint8Array([10, 77, 0, 2]) }, udp);
    return bytes;
  });
  writeFileSync(file, Buffer.concat(chunks));
  const frames = await tsharkJson(file);
  t.equal(frames.length, mads.length);
  mads.forEach((m, i) => {
    const ws = flatten(frames[i]?._source.layers.infiniband);
    const r = parseCmMad(emitted[i]!);
    if (!r.ok) return t.fail(`${m.msg.kind}: ${r.error}`);
    t.same(cmMadBytes(r.mad), emitted[i]!, `${m.msg.kind}: emit(parse(x)) is x`);
    compareFrame(t, `synthetic ${i + 1} ${m.msg.kind}`, r.mad, emitted[i]!, ws);
  });
});
